"""A real Kubernetes control plane on loopback for kubetrain's tests and development.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as local processes built from
upstream sources (hack/build-k8s.sh); kwok simulates nodes and the kubelet's pod lifecycle.
"""

{{/*
Names. The fullname is the release name when it already contains the chart name, so
`helm install kubetrain charts/kubetrain` gives objects named `kubetrain`, not `kubetrain-kubetrain`.
Kubernetes names are capped at 63 characters; the cap applies after the override.
*/}}
{{- define "kubetrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubetrain.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kubetrain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object, so `kubectl get all -l app.kubernetes.io/instance=<release>` finds them. */}}
{{- define "kubetrain.commonLabels" -}}
helm.sh/chart: {{ include "kubetrain.chart" . }}
app.kubernetes.io/name: {{ include "kubetrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubetrain
{{- end }}

{{/* The operator's objects. */}}
{{- define "kubetrain.labels" -}}
{{ include "kubetrain.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The workers' identity objects (their ServiceAccount, Role, admission policy). */}}
{{- define "kubetrain.workerLabels" -}}
{{ include "kubetrain.commonLabels" . }}
app.kubernetes.io/component: worker
{{- end }}

{{/* Selector labels are immutable on a Deployment: they must never include the version. */}}
{{- define "kubetrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubetrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kubetrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubetrain.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference: repository@digest when a digest is pinned, else repository:tag. */}}
{{- define "kubetrain.image" -}}
{{- if .digest }}
{{- printf "%s@%s" .repository .digest }}
{{- else }}
{{- printf "%s:%s" .repository .tag }}
{{- end }}
{{- end }}

{{/* True (non-empty) when the operator watches every namespace. */}}
{{- define "kubetrain.clusterwide" -}}
{{- if not .Values.watchNamespaces }}true{{- end }}
{{- end }}

{{/*
The RBAC rules the operator needs in every namespace it watches: exactly the verbs its code and kopf use
(tests/chart/chartkit.py OPERATOR_NEEDS lists the same, and the cluster test asks the API server).
- trainingjobs: kopf lists and watches them into the operator's cache and writes nothing on them (no
  annotations, no finalizer); the controller's audit lists them again every 5 minutes, gets one before
  creating children that are not its first (a job deleted while its cache copy lags must not get them
  again) and deletes a finished one when ttlSecondsAfterFinished expires.
  trainingjobs/status: status is only ever merge-patched, by the controller.
  trainingjobs/finalizers: update, never used as a request: every child's ownerReference sets
  blockOwnerDeletion (a foreground deletion of the TrainingJob waits for its children), and the
  OwnerReferencesPermissionEnforcement admission plugin (OpenShift, hardened clusters) refuses that
  unless the creator may update the owner's finalizers.
- jobs (batch): the operator's informers list and watch the workers' Jobs (label-selected) into the
  cache; the controller creates and deletes them (group restart, suspend, cleanup) and gets one only
  when a create answers 409 AlreadyExists, to see who controls it. Never patched.
- services: listed and watched the same way; the controller creates and deletes one headless Service per
  TrainingJob.
- pods: read-only, listed and watched (label-selected) for exit codes, readiness and why a worker is
  Pending. Pods go away with their Jobs (propagationPolicy), never deleted directly.
- events (core v1): the controller creates one per transition; it never patches events.
- podgroups (scheduling.volcano.sh, scheduling.x-k8s.io), per gangSchedulers: a TrainingJob with
  spec.gangScheduling gets one PodGroup, fetched and created by the controller, deleted by the garbage
  collector through its ownerReference.
No Secrets, ConfigMaps, ServiceAccounts or RBAC objects here; watching all namespaces, rbac.yaml adds
creating (only) the workers' ServiceAccount and RoleBinding where they run.
*/}}
{{- define "kubetrain.namespacedRules" -}}
- apiGroups: ["kubetrain.io"]
  resources: ["trainingjobs"]
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: ["kubetrain.io"]
  resources: ["trainingjobs/status"]
  verbs: ["patch"]
- apiGroups: ["kubetrain.io"]
  resources: ["trainingjobs/finalizers"]
  verbs: ["update"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.kueue.enabled }}
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- range .Values.gangSchedulers }}
{{- if eq . "kubernetes" }}
- apiGroups: ["scheduling.k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "create"]
- apiGroups: ["scheduling.k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "create", "delete"]
{{- else }}
- apiGroups: [{{ get (dict "volcano" "scheduling.volcano.sh" "scheduler-plugins" "scheduling.x-k8s.io") . | quote }}]
  resources: ["podgroups"]
  verbs: ["get", "create"]
{{- end }}
{{- end }}
{{- end }}

{{/* Kueue's cluster-scoped objects the operator reads: ResourceFlavors (watched: their node labels and
tolerations go on admitted workers) and the priority classes a queued TrainingJob names. */}}
{{- define "kubetrain.kueueClusterRules" -}}
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors"]
  verbs: ["list", "watch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloadpriorityclasses"]
  verbs: ["get"]
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["get"]
{{- end }}

{{/* The leader-election Lease's name: leaderElection.leaseName, else the release's full name. */}}
{{- define "kubetrain.leaseName" -}}
{{- default (include "kubetrain.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* The workers' ClusterRole (all namespaces): the operator binds it to the worker ServiceAccount it
creates in each namespace where workers run. */}}
{{- define "kubetrain.workerClusterRole" -}}
{{- printf "%s-worker" (include "kubetrain.fullname" .) }}
{{- end }}

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
{{- define "kubetrain.labels" -}}
helm.sh/chart: {{ include "kubetrain.chart" . }}
{{ include "kubetrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubetrain
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
The RBAC rules the operator needs in every namespace it watches: exactly the verbs its code and kopf use.
- trainingjobs: kopf lists/watches them and patches its bookkeeping annotations; the operator deletes a
  finished job when ttlSecondsAfterFinished expires. /status: status is written with patches only.
- jobs (batch): one Job per worker; created, deleted on group restart, suspend and cleanup, patched to
  adopt or relabel. Services: one headless Service per TrainingJob. Pods: read-only, to learn exit codes,
  readiness and why a worker is Pending; pods are removed through their Jobs (propagationPolicy).
- events (core and events.k8s.io): kopf and the operator report every transition on the TrainingJob.
- kopfpeerings: only in namespaced mode with peering: kopf keeps a per-namespace keep-alive record.
No Secrets, ConfigMaps, ServiceAccounts or RBAC objects: the operator never touches them.
*/}}
{{- define "kubetrain.namespacedRules" -}}
- apiGroups: ["kubetrain.io"]
  resources: ["trainingjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["kubetrain.io"]
  resources: ["trainingjobs/status"]
  verbs: ["get", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* The kopf peering object's name: peering.name, else the release's full name. */}}
{{- define "kubetrain.peeringName" -}}
{{- default (include "kubetrain.fullname" .) .Values.peering.name }}
{{- end }}

{{/*
Chart name, truncated to 63 characters (the DNS label limit of some name fields).
*/}}
{{- define "kubetrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: "<release>-<chart>", or the release name when it already contains the chart
name; truncated to 63 characters.
*/}}
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

{{/*
Chart name and version for the helm.sh/chart label.
*/}}
{{- define "kubetrain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Standard labels on every object.
*/}}
{{- define "kubetrain.labels" -}}
helm.sh/chart: {{ include "kubetrain.chart" . }}
{{ include "kubetrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubetrain
{{- end }}

{{/*
Selector labels: minimal, because a Deployment's selector is immutable.
*/}}
{{- define "kubetrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubetrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of monitoring objects (ServiceMonitor, PodMonitor, PrometheusRule, dashboards): the standard labels,
the `release` label kube-prometheus-stack selects on, and the shared extra labels. Takes a dict with
"ctx" (the root context) and "labels" (the object's own extra labels).
*/}}
{{- define "kubetrain.monitoringLabels" -}}
{{- $ctx := .ctx }}
{{- include "kubetrain.labels" $ctx }}
{{- with $ctx.Values.monitoring.release }}
release: {{ . | quote }}
{{- end }}
{{- with $ctx.Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- with .labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The full name with a suffix, the full name shortened so that the result stays within 63 characters.
Takes a list: (root context, suffix).
*/}}
{{- define "kubetrain.suffixedName" -}}
{{- $suffix := index . 1 }}
{{- $room := int (sub 62 (len $suffix)) }}
{{- printf "%s-%s" (include "kubetrain.fullname" (index . 0) | trunc $room | trimSuffix "-") $suffix }}
{{- end }}

{{/*
Name of the operator's metrics Service (a DNS label: at most 63 characters).
*/}}
{{- define "kubetrain.metricsServiceName" -}}
{{- include "kubetrain.suffixedName" (list . "metrics") }}
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "kubetrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubetrain.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference: repository:tag, or repository:tag@digest when a digest is set; the tag defaults to the
chart's appVersion. Takes a dict: "image" (repository, tag, digest) and "ctx" (the root context).
*/}}
{{- define "kubetrain.imageRef" -}}
{{- $tag := default .ctx.Chart.AppVersion .image.tag }}
{{- if .image.digest }}
{{- printf "%s:%s@%s" .image.repository $tag .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{/*
Arguments of `kubetrain operator` (see `kubetrain operator --help`): the watched namespaces, the metrics
port, kopf's liveness endpoint, logging, the trainer image of jobs without spec.image, then the user's
extra args (last, so that they win over the chart's own).
*/}}
{{- define "kubetrain.operatorArgs" -}}
- operator
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --metrics-port={{ .Values.operator.metricsPort }}
- --liveness=http://0.0.0.0:{{ .Values.operator.healthPort }}/healthz
- --log-level={{ .Values.operator.logLevel }}
- --log-format={{ .Values.operator.logFormat }}
- {{ printf "--trainer-image=%s" (include "kubetrain.imageRef" (dict "image" .Values.trainer.image "ctx" .)) | quote }}
- --gang-scheduling={{ include "kubetrain.gangScheduling" . }}
- --api-connections={{ .Values.operator.apiConnections }}
- --looks-per-second={{ .Values.operator.looksPerSecond }}
{{- with .Values.operator.extraArgs }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
RBAC rules on the objects of one namespace (used by the ClusterRole in cluster-wide mode and by one Role
per watched namespace otherwise). Grouped by purpose; nothing else, no Secrets.
*/}}
{{- define "kubetrain.namespacedRules" -}}
# Exactly what the operator calls (tests/test_rbac.py derives this list from its code and kopf's registry).
# The TrainingJobs: kopf lists and watches them; the operator reads one before each reconcile and deletes
# those whose ttlSecondsAfterFinished has passed. (No finalizers or annotations: it never patches them.)
- apiGroups: ["kubetrain.io"]
  resources: ["trainingjobs"]
  verbs: ["get", "list", "watch", "delete"]
# Their status subresource: phase, conditions, progress (a merge patch, never an update).
- apiGroups: ["kubetrain.io"]
  resources: ["trainingjobs/status"]
  verbs: ["patch"]
# One pod per node: watched by kopf (an index of each job's pods), created, read back when the name is taken, adopted
# (owner reference patched back) and deleted on gang restarts and cleanup.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# The headless Service of each job: created, read back when the name is taken, replaced when a deleted job
# of the same name left it.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "delete"]
# The PodGroup of each attempt (with gang scheduling on): created, read back when the name is taken, deleted
# when the next attempt starts or a deleted job of the same name left it. Harmless where the API is not served.
- apiGroups: ["scheduling.k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "create", "delete"]
# The Kueue Workload of each job labelled kueue.x-k8s.io/queue-name: watched by kopf (Kueue admits, evicts), read
# before the job's reconcile, created, kept in step (inactive while suspended, an elastic resize). Harmless
# where Kueue is not installed.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Their status: Finished when the job ends, the admission given back after an eviction (a merge patch).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
# A queued job's position (status.queuePosition): its LocalQueue's pending Workloads, from Kueue's visibility API.
- apiGroups: ["visibility.kueue.x-k8s.io"]
  resources: ["localqueues/pendingworkloads"]
  verbs: ["get"]
# Events on TrainingJobs: kopf posts core/v1 events (create only).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/*
RBAC rules the operator needs cluster-wide in either mode: kopf finds the CRD it serves, and the operator reads
the cluster-scoped objects a Kueue admission names.
*/}}
{{- define "kubetrain.discoveryRules" -}}
# kopf scans CRDs at start-up and watches them for changes of the served resource.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# A job in a Kueue queue: the admitted ResourceFlavors' node labels and tolerations go onto its pods.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors"]
  verbs: ["get"]
# Its PriorityClass's value is its Workload's priority (Kueue orders and preempts by it); a job that names none
# gets the cluster's globalDefault one's, found in the list, as Kueue's own integrations find it.
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["get", "list"]
# A node that keeps failing a job is avoided only while enough Ready nodes remain for its gang; a node cordoned
# or tainted NoExecute (a drain, a reclaim announced) has the jobs on it checkpoint at once.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
{{- end }}

{{/*
One alerting rule. Takes a dict: ctx (root context), name, cfg (the alert's values: for, severity), expr,
summary and description (Prometheus templates, already escaped from Helm by the caller).
*/}}
{{- define "kubetrain.alertRule" -}}
- alert: {{ .name }}
  expr: |-
    {{- .expr | trim | nindent 4 }}
  for: {{ .cfg.for }}
  labels:
    severity: {{ .cfg.severity }}
    {{- with .ctx.Values.prometheusRule.additionalAlertLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    summary: {{ .summary | quote }}
    description: {{ .description | quote }}
    runbook_url: {{ printf "%s#%s" .ctx.Values.prometheusRule.runbookUrl (lower .name) | quote }}
{{- end }}

{{/* gangScheduling as the operator's flag takes it: YAML reads an unquoted on/off as a boolean. */}}
{{- define "kubetrain.gangScheduling" -}}
{{- if kindIs "bool" .Values.gangScheduling -}}
{{- ternary "on" "off" .Values.gangScheduling -}}
{{- else -}}
{{- .Values.gangScheduling -}}
{{- end -}}
{{- end -}}

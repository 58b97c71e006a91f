{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "radixserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name alone when it already holds the chart name. */}}
{{- define "radixserve.fullname" -}}
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

{{- define "radixserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades (a Deployment selector is immutable). */}}
{{- define "radixserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "radixserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels for objects that are not the operator's own (never its selector labels). */}}
{{- define "radixserve.commonLabels" -}}
helm.sh/chart: {{ include "radixserve.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: radixserve
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "radixserve.labels" -}}
{{ include "radixserve.selectorLabels" . }}
{{ include "radixserve.commonLabels" . }}
{{- end }}

{{- define "radixserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "radixserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, the tag defaulting to the chart's appVersion. Call with (list repo tag ctx). */}}
{{- define "radixserve.image" -}}
{{- $repo := index . 0 }}{{- $tag := index . 1 }}{{- $ctx := index . 2 }}
{{- printf "%s:%s" $repo (default $ctx.Chart.AppVersion $tag) }}
{{- end }}

{{/*
Rules the operator needs in every namespace it reconciles: its own resource, the children it
creates for each InferenceService, and the EndpointSlice rights it grants the router Role (RBAC
lets a subject grant only what it holds).
*/}}
{{- define "radixserve.namespacedRules" -}}
- apiGroups: ["radixserve.io"]
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["radixserve.io"]
  resources: ["inferenceservices/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.networkPolicy.enabled }}
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
{{- end }}
{{- end }}

{{/* Cluster-scoped rules kopf needs: CRD discovery, and namespace observation when namespaced. */}}
{{- define "radixserve.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- end }}

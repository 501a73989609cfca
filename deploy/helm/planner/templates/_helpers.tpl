{{/* Names and labels. */}}
{{- define "planner.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "planner.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "planner.selectorLabels" -}}
app.kubernetes.io/name: {{ include "planner.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "planner.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "planner.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "planner.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "planner.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "planner.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The namespaces served, as a JSON list (watch.scope=namespaces). */}}
{{- define "planner.watchNamespaces" -}}
{{- default (list .Release.Namespace) .Values.watch.namespaces | toJson -}}
{{- end -}}

{{/* "true" when a served namespace is a glob (kopf then lists namespaces to match). */}}
{{- define "planner.hasGlobs" -}}
{{- $globs := false -}}
{{- range (include "planner.watchNamespaces" . | fromJsonArray) -}}
{{- if regexMatch "[*?\\[\\]!]" . -}}{{- $globs = true -}}{{- end -}}
{{- end -}}
{{- ternary "true" "false" (and $globs (ne .Values.watch.scope "cluster")) -}}
{{- end -}}

{{/*
The API calls the controller makes, one rule per resource (see src/disagg_planner/connectors/kubernetes.py and
src/disagg_planner/operator/app.py). Argument: dict "root" $ "peering" <resource or ""> "scan" <bool>.
*/}}
{{- define "planner.rules" -}}
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeploymentscalingadapters"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeploymentscalingadapters/scale"]
  verbs: ["patch"]
- apiGroups: ["nvidia.com"]
  resources: ["dynamoworkermetadatas"]
  verbs: ["list", "watch"]
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaimtemplates"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["planner.autoscaling.dev"]
  resources: ["plannerpolicies"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["planner.autoscaling.dev"]
  resources: ["plannerpolicies/status"]
  verbs: ["patch"]
- apiGroups: ["planner.autoscaling.dev"]
  resources: ["plannerpools"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["planner.autoscaling.dev"]
  resources: ["plannerpools/status"]
  verbs: ["patch"]
{{- if .peering }}
- apiGroups: ["kopf.dev"]
  resources: [{{ .peering | quote }}]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- if .scan }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}
{{- end -}}

{{/* The planner config file: the user's settings plus what the chart owns. */}}
{{- define "planner.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- if not (hasKey $config "report_output_dir") -}}
{{- $_ := set $config "report_output_dir" "/var/lib/planner/reports" -}}
{{- end -}}
{{- $_ := set $config "metric_reporting_prometheus_port" (int .Values.metrics.port) -}}
{{- toYaml $config -}}
{{- end -}}

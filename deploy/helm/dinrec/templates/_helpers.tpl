{{/* The release's full name: the release name, with "dinrec" added unless it already has it. */}}
{{- define "dinrec.fullname" -}}
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

{{- define "dinrec.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* Labels that select a component's pods (stable across upgrades: never the version). */}}
{{- define "dinrec.selector" -}}
app.kubernetes.io/name: {{ default .root.Chart.Name .root.Values.nameOverride }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every object's labels; call with (dict "root" $ "component" "api"). */}}
{{- define "dinrec.labels" -}}
{{ include "dinrec.selector" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: dinrec
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* The metadata block every object opens with; call with (dict "root" $ "component" "api" "name" "…"). */}}
{{- define "dinrec.metadata" -}}
name: {{ .name }}
namespace: {{ include "dinrec.namespace" .root }}
labels:
  {{- include "dinrec.labels" . | nindent 2 }}
{{- end -}}

{{- define "dinrec.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "dinrec.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dinrec.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* What every pod of the chart shares: its account, the locked-down security context, pull secrets. */}}
{{- define "dinrec.podSpec" -}}
serviceAccountName: {{ include "dinrec.serviceAccountName" . }}
automountServiceAccountToken: false  # no component calls the Kubernetes API
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile: {type: RuntimeDefault}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A container's security context: nothing written outside its volumes, no privilege. */}}
{{- define "dinrec.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end -}}

{{/* nodeSelector, tolerations and affinity of a component's values, where set. */}}
{{- define "dinrec.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The admin token, from the Secret the values name (admin is off without one). */}}
{{- define "dinrec.tokenEnv" -}}
{{- if .Values.adminToken.existingSecret }}
- name: DINREC_ADMIN_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ .Values.adminToken.existingSecret }}, key: {{ .Values.adminToken.key }}}
{{- end }}
{{- if .Values.resultsToken.existingSecret }}
- name: DINREC_RESULTS_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ .Values.resultsToken.existingSecret }}, key: {{ .Values.resultsToken.key }}}
{{- end }}
{{- end -}}

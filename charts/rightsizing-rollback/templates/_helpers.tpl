{{/*
Names are fixed, as in deploy/ (kustomize): one engine per cluster, since its CRDs, ClusterRoles
and the workloads it watches are cluster-wide. The release only chooses the namespace.
*/}}

{{/* Labels on every object: kustomize's part-of, plus Helm's own (the CRDs: Helm's only). */}}
{{- define "rollback.labels" -}}
app.kubernetes.io/part-of: rightsizing-rollback
{{ include "rollback.helmLabels" . }}
{{- end }}

{{- define "rollback.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
A process's pod template labels: its name (what the selectors match, which never change: a
Deployment's selector is immutable), part-of, instance, component, and podLabels. Call with
(list $ "rollback-worker" "worker" build); a versioned worker's build is its version label.
*/}}
{{- define "rollback.podLabels" -}}
{{- $root := index . 0 }}{{ $build := index . 3 }}
{{- with $root.Values.podLabels }}
{{ toYaml . }}
{{- end }}
app.kubernetes.io/name: {{ index . 1 }}
app.kubernetes.io/part-of: rightsizing-rollback
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 2 }}
app.kubernetes.io/version: {{ $build | default $root.Chart.AppVersion | quote }}
{{- end }}

{{/*
The image both processes run, as registry/repository:tag or @digest; the tag defaults to the
chart's appVersion. Call with (list $ tag): "" for the default; a versioned worker's build is
its tag (a digest pins one image, not one per build).
*/}}
{{- define "rollback.image" -}}
{{- $root := index . 0 }}{{ $image := $root.Values.image }}
{{- $repository := $image.repository }}
{{- with $image.registry }}{{ $repository = printf "%s/%s" . $repository }}{{ end }}
{{- if and $image.digest (not (index . 1)) }}
{{- printf "%s@%s" $repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (index . 1 | default $image.tag | default $root.Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* A process's ServiceAccount name. Call with (list $ "worker"). */}}
{{- define "rollback.serviceAccount" -}}
{{- $root := index . 0 }}{{ $process := index . 1 }}
{{- (index $root.Values $process).serviceAccount.name | default (printf "rollback-%s" $process) }}
{{- end }}

{{/*
The pod-level settings both processes share: the placement values, and a process's own
affinity and spread. Call with (list $ "worker").
*/}}
{{- define "rollback.placement" -}}
{{- $root := index . 0 }}{{ $own := index $root.Values (index . 1) }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $root.Values.nodeSelector }}
nodeSelector: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with $own.affinity }}
affinity: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with $own.topologySpreadConstraints }}
topologySpreadConstraints: {{ toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Credentials for Temporal, mounted as files from existing Secrets (never in the environment). */}}
{{- define "rollback.temporalEnv" -}}
{{- if .Values.temporal.apiKey.existingSecret }}
- {name: TEMPORAL_API_KEY_FILE, value: /etc/temporal-api-key/{{ .Values.temporal.apiKey.key }}}
{{- end }}
{{- if .Values.temporal.tls.existingSecret }}
- {name: TEMPORAL_TLS_CLIENT_CERT_PATH, value: /etc/temporal-tls/tls.crt}
- {name: TEMPORAL_TLS_CLIENT_KEY_PATH, value: /etc/temporal-tls/tls.key}
{{- if .Values.temporal.tls.serverCA }}
- {name: TEMPORAL_TLS_SERVER_CA_CERT_PATH, value: /etc/temporal-tls/ca.crt}
{{- end }}
{{- end }}
{{- end }}

{{- define "rollback.temporalMounts" -}}
{{- if .Values.temporal.apiKey.existingSecret }}
- {name: temporal-api-key, mountPath: /etc/temporal-api-key, readOnly: true}
{{- end }}
{{- if .Values.temporal.tls.existingSecret }}
- {name: temporal-tls, mountPath: /etc/temporal-tls, readOnly: true}
{{- end }}
{{- end }}

{{- define "rollback.temporalVolumes" -}}
{{- if .Values.temporal.apiKey.existingSecret }}
- name: temporal-api-key
  secret: {secretName: {{ .Values.temporal.apiKey.existingSecret }}, defaultMode: 0440}
{{- end }}
{{- if .Values.temporal.tls.existingSecret }}
- name: temporal-tls
  secret: {secretName: {{ .Values.temporal.tls.existingSecret }}, defaultMode: 0440}
{{- end }}
{{- end }}

{{/* The probes: /livez and /readyz reflect the process itself (docs/operating/scale.md, "Probes"). */}}
{{- define "rollback.probes" -}}
readinessProbe:
  httpGet: {path: /readyz, port: health}
  periodSeconds: 10
livenessProbe:
  httpGet: {path: /livez, port: health}
  initialDelaySeconds: 20
  periodSeconds: 20
{{- end }}

{{- define "rollback.podEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
{{- end }}

{{/*
A Role's or ClusterRole's rules, read from the kustomize tree (files/ links into deploy/), so the chart and
kustomize grant the same verbs by construction. Call with (list $ "file" "role name").
*/}}
{{- define "rollback.rules" -}}
{{- $root := index . 0 }}{{ $file := index . 1 }}{{ $name := index . 2 }}
{{- range splitList "\n---\n" ($root.Files.Get (printf "files/%s" $file)) }}
{{- $obj := fromYaml . }}
{{- if and (hasKey $obj "rules") (eq (get $obj.metadata "name") $name) }}
{{- /* deploy/'s resourceNames name the engine's namespace as kustomize installs it */}}
{{- toYaml $obj.rules | replace "- rightsizing-rollback\n" (printf "- %s\n" $root.Release.Namespace) }}
{{- end }}
{{- end }}
{{- end }}

{{/* A `helm test` container: the engine's image, settings, credentials and security context. */}}
{{- define "rollback.testContainer" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
envFrom:
  - configMapRef: {name: rightsizing-rollback}
  {{- with .Values.extraEnvFrom }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
env:
  {{- include "rollback.temporalEnv" . | nindent 2 }}
  {{- include "rollback.podEnv" . | nindent 2 }}
  {{- with .Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
resources: {requests: {cpu: 50m, memory: 128Mi}, limits: {memory: 256Mi}}
securityContext: {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  {{- include "rollback.temporalMounts" . | nindent 2 }}
  - {name: tmp, mountPath: /tmp}
  {{- with .Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{- /* The TCP port of a URL: the one it names, else its scheme's (80, 443). */ -}}
{{- define "rollback.urlPort" -}}
{{- $u := urlParse . -}}
{{- $hostPort := splitList ":" $u.host -}}
{{- if gt (len $hostPort) 1 -}}{{ last $hostPort }}{{- else if eq $u.scheme "https" -}}443{{- else -}}80{{- end -}}
{{- end }}

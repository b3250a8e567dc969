{{/*
Names are fixed, as in deploy/ (kustomize): one engine per cluster, since its CRDs, ClusterRoles
and the workloads it watches are cluster-wide. The release only chooses the namespace.
*/}}

{{/* Labels on every object: kustomize's part-of, plus Helm's own. */}}
{{- define "rollback.labels" -}}
app.kubernetes.io/part-of: rightsizing-rollback
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The image both processes run: the tag defaults to the chart's appVersion. */}}
{{- define "rollback.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The pod-level settings both processes share: the security context we promise (non-root, no
privilege escalation, read-only root) and the placement values.
*/}}
{{- define "rollback.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile: {type: RuntimeDefault}
{{- end }}

{{- define "rollback.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end }}

{{- define "rollback.placement" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{ toYaml . | nindent 2 }}
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
{{- toYaml $obj.rules }}
{{- end }}
{{- end }}
{{- end }}

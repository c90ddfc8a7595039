{{- define "fusebox.name" -}}{{ .Release.Name }}-fusebox{{- end -}}
{{- define "fusebox.labels" -}}
app.kubernetes.io/name: fusebox
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
{{- define "fusebox.selector" -}}
app.kubernetes.io/name: fusebox
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "fusebox.tokenSecret" -}}
{{- if .Values.adminToken.existingSecret -}}{{ .Values.adminToken.existingSecret }}{{- else -}}{{ include "fusebox.name" . }}-admin{{- end -}}
{{- end -}}
{{- define "fusebox.redisSecret" -}}
{{- if .Values.redis.existingSecret -}}{{ .Values.redis.existingSecret }}{{- else -}}{{ include "fusebox.name" . }}-redis{{- end -}}
{{- end -}}
{{- define "fusebox.check" -}}
{{- if not (has .Values.mode (list "sidecar" "deployment")) -}}
{{- fail (printf "mode must be sidecar or deployment, got %q" .Values.mode) -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.redis.url) (not .Values.redis.existingSecret) -}}
{{- fail "replicas > 1 needs redis.url (or redis.existingSecret): each replica would keep its own breakers and admin changes" -}}
{{- end -}}
{{- if and (not .Values.adminToken.existingSecret) (not .Values.adminToken.value) -}}
{{- fail "set adminToken.existingSecret or adminToken.value: the admin API listens beyond loopback and needs a token" -}}
{{- end -}}
{{- end -}}
{{- define "fusebox.container" -}}
- name: fusebox
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - -config
    - /etc/fusebox/fusebox.yaml
    - -log-format
    - json
    - -grace-period
    - 15s
    - -grpc-addr
    - {{ if eq .Values.mode "sidecar" }}unix:///run/fusebox/extproc.sock{{ else }}0.0.0.0:50051{{ end }}
    - -admin-addr
    - 0.0.0.0:8090
  env:
    {{- if or .Values.redis.url .Values.redis.existingSecret }}
    # The Redis URL (its password with it) from a Secret, never in the
    # pod's arguments.
    - name: FUSEBOX_REDIS_URL
      valueFrom:
        secretKeyRef: {name: {{ include "fusebox.redisSecret" . }}, key: url}
    {{- end }}
    - name: FUSEBOX_ADMIN_TOKEN
      valueFrom:
        secretKeyRef: {name: {{ include "fusebox.tokenSecret" . }}, key: token}
    # The OS cache dir, where the overlay cache goes (store.redis.overlay_cache,
    # R-ST15): the writable state volume (the root filesystem is read-only).
    - name: XDG_CACHE_HOME
      value: /var/lib/fusebox
  ports:
    {{- if eq .Values.mode "deployment" }}
    - {name: grpc, containerPort: 50051}
    {{- end }}
    - {name: admin, containerPort: 8090}
  readinessProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: 2
    failureThreshold: 2
  livenessProbe:
    httpGet: {path: /healthz, port: admin}
    periodSeconds: 10
    failureThreshold: 3
  volumeMounts:
    - {name: fusebox-config, mountPath: /etc/fusebox, readOnly: true}
    - {name: fusebox-state, mountPath: /var/lib/fusebox}
    {{- if eq .Values.mode "sidecar" }}
    - {name: fusebox-socket, mountPath: /run/fusebox}
    {{- end }}
    {{- if .Values.redis.hmacKeySecret }}
    - {name: fleet-key, mountPath: /etc/fusebox-key, readOnly: true}
    {{- end }}
  resources: {{- toYaml .Values.resources.fusebox | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities: {drop: ["ALL"]}
{{- end -}}

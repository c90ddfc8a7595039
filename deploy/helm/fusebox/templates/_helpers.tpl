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
  {{- /* With listen.tls the admin listener serves TLS too (R-L5): the
         kubelet's HTTPS probes do not verify the certificate. */}}
  readinessProbe:
    httpGet: {path: /readyz, port: admin{{ if include "fusebox.tlsOn" . }}, scheme: HTTPS{{ end }}}
    periodSeconds: 2
    failureThreshold: 2
  livenessProbe:
    httpGet: {path: /healthz, port: admin{{ if include "fusebox.tlsOn" . }}, scheme: HTTPS{{ end }}}
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
    {{- if include "fusebox.tlsOn" . }}
    - {name: fusebox-tls, mountPath: {{ include "fusebox.tlsDir" . }}, readOnly: true}
    {{- end }}
  resources: {{- toYaml .Values.resources.fusebox | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities: {drop: ["ALL"]}
{{- end -}}
{{- /* files/envoy.yaml with envoy.providerHosts: each provider cluster's
       address and SNI, in two passes through placeholders so one host
       given to another cluster is never replaced twice. */ -}}
{{- define "fusebox.envoyConfig" -}}
{{- $cfg := .Files.Get "files/envoy.yaml" -}}
{{- $defaults := dict "openai_us_east" "api.openai.com" "azure_eu_west" "my-resource.openai.azure.com" "anthropic_us" "api.anthropic.com" "azure_us_east" "my-resource-us.openai.azure.com" "gpu_east_a" "gpu-east-a.internal" "gpu_east_b" "gpu-east-b.internal" "bedrock_us_east_1" "bedrock-runtime.us-east-1.amazonaws.com" -}}
{{- range $cluster, $host := .Values.envoy.providerHosts -}}
{{- if not (hasKey $defaults $cluster) -}}
{{- fail (printf "envoy.providerHosts.%s: files/envoy.yaml has no such provider cluster (it has %s)" $cluster (keys $defaults | sortAlpha | join ", ")) -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$" (toString $host)) -}}
{{- fail (printf "envoy.providerHosts.%s: %q is not a host name" $cluster (toString $host)) -}}
{{- end -}}
{{- $old := get $defaults $cluster -}}
{{- $cfg = replace (printf "{address: %s," $old) (printf "{address: @@%s@@," $cluster) $cfg -}}
{{- $cfg = replace (printf "sni: %s\n" $old) (printf "sni: @@%s@@\n" $cluster) $cfg -}}
{{- end -}}
{{- range $cluster, $host := .Values.envoy.providerHosts -}}
{{- $cfg = replace (printf "@@%s@@" $cluster) (toString $host) $cfg -}}
{{- end -}}
{{- $cfg -}}
{{- end -}}
{{- define "fusebox.tlsDir" -}}/etc/fusebox-tls{{- end -}}
{{- /* "true" when the ext_proc listener serves TLS (deployment mode with
       tls.secretName), "" otherwise. */ -}}
{{- define "fusebox.tlsOn" -}}{{ if and (eq .Values.mode "deployment") .Values.tls.secretName }}true{{ end }}{{- end -}}

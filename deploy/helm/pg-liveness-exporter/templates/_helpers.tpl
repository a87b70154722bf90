{{/*
Names and labels. These take the root context.
*/}}

{{- define "pg-liveness-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pg-liveness-exporter.fullname" -}}
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

{{- define "pg-liveness-exporter.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "pg-liveness-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pg-liveness-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- /* An object's labels; takes a list: the root context, the component (or ""), and
maps of further labels, earlier ones winning. The chart's own labels win over them (the
selectors rely on those), and all of them over commonLabels. */}}
{{- define "pg-liveness-exporter.labels" -}}
{{- $root := index . 0 }}
{{- $out := dict
  "helm.sh/chart" (printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-")
  "app.kubernetes.io/name" (include "pg-liveness-exporter.name" $root)
  "app.kubernetes.io/instance" $root.Release.Name
  "app.kubernetes.io/managed-by" $root.Release.Service }}
{{- with index . 1 }}
{{- $_ := set $out "app.kubernetes.io/component" . }}
{{- end }}
{{- range slice . 2 }}
{{- $out = merge $out (deepCopy (. | default dict)) }}
{{- end }}
{{- $out = merge $out (deepCopy ($root.Values.commonLabels | default dict)) }}
{{- toYaml $out }}
{{- end }}

{{- define "pg-liveness-exporter.observer.selectorLabels" -}}
{{ include "pg-liveness-exporter.selectorLabels" . }}
app.kubernetes.io/component: observer
{{- end }}

{{- define "pg-liveness-exporter.nodeAgent.selectorLabels" -}}
{{ include "pg-liveness-exporter.selectorLabels" . }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "pg-liveness-exporter.nodeAgent.fullname" -}}
{{- printf "%s-node-agent" (include "pg-liveness-exporter.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- /* Where a process of the release's namespace attaches to its node's agent
(liveness.AgentConfig.NodeAgentSocket). Takes the root context. */}}
{{- define "pg-liveness-exporter.nodeAgent.address" -}}
{{- printf "tcp://%s.%s.svc:%v" (include "pg-liveness-exporter.nodeAgent.fullname" .) (include "pg-liveness-exporter.namespace" .) .Values.nodeAgent.port }}
{{- end }}

{{- define "pg-liveness-exporter.observer.serviceAccountName" -}}
{{- if .Values.observer.serviceAccount.create }}
{{- default (include "pg-liveness-exporter.fullname" .) .Values.observer.serviceAccount.name }}
{{- else }}
{{- .Values.observer.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Checks of extraArgs and extraEnv; they take a list: where (the values' path), the list,
and the flags (or variables) the chart sets itself. A refused DSN flag is named, never
its value.
*/}}

{{- define "pg-liveness-exporter.checkArgs" -}}
{{- $where := index . 0 }}
{{- $owned := index . 2 }}
{{- range (index . 1) }}
{{- $flag := regexReplaceAll "=.*$" (toString .) "" | trimPrefix "--" }}
{{- $name := trimPrefix "no-" $flag }}
{{- if eq $name "db.dsn" }}
{{- fail (printf "%s: --%s would put a DSN in the process list; put it in the Secret named by dsn.existingSecret" $where $flag) }}
{{- end }}
{{- if eq $name "db.direct-dsn" }}
{{- fail (printf "%s: --%s would put a DSN in the process list; put it in a Secret and pass its file with --db.direct-dsn-file" $where $flag) }}
{{- end }}
{{- if has $name $owned }}
{{- fail (printf "%s: --%s is set by the chart; remove it" $where $flag) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pg-liveness-exporter.checkEnv" -}}
{{- $where := index . 0 }}
{{- $owned := index . 2 }}
{{- range (index . 1) }}
{{- if has .name (list "DATA_SOURCE_NAME" "DATA_SOURCE_PASS" "PGPASSWORD" "PG_LIVENESS_EXPORTER_DB_DSN" "PG_LIVENESS_EXPORTER_DB_DIRECT_DSN") }}
{{- fail (printf "%s: %s would put a DSN or password in the environment; put the DSN in the Secret named by dsn.existingSecret" $where .name) }}
{{- end }}
{{- if has .name $owned }}
{{- fail (printf "%s: %s is set by the chart; remove it" $where .name) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Pieces of both containers; they take the chart's values.
*/}}

{{- define "pg-liveness-exporter.image" -}}
{{- if .image.digest }}
image: {{ printf "%s@%s" .image.repository .image.digest | quote }}
{{- else }}
image: {{ printf "%s:%s" .image.repository .image.tag | quote }}
{{- end }}
imagePullPolicy: {{ .image.pullPolicy }}
{{- end }}

{{- /* The container's probes, from values with livenessProbe and readinessProbe (the
observer's, the agent's or the node agent's). */}}
{{- define "pg-liveness-exporter.probes" -}}
livenessProbe:
  {{- include "pg-liveness-exporter.probe" .livenessProbe | nindent 2 }}
readinessProbe:
  {{- include "pg-liveness-exporter.probe" .readinessProbe | nindent 2 }}
{{- end }}

{{- /* One probe from its values. Helm merges a user's probe into the default one key by
key, so a user's tcpSocket, exec or grpc would come with the default httpGet, and the API
server refuses a probe with two handlers ("may not specify more than 1 handler type"):
the user's handler replaces the default httpGet. */}}
{{- define "pg-liveness-exporter.probe" -}}
{{- $p := deepCopy . }}
{{- if or $p.tcpSocket $p.exec $p.grpc }}
{{- $_ := unset $p "httpGet" }}
{{- end }}
{{- toYaml $p }}
{{- end }}

{{- /* A monitor endpoint's scrape settings beyond the chart's relabelings: takes the
monitor's values (podMonitor, serviceMonitor). */}}
{{- define "pg-liveness-exporter.endpointSettings" -}}
honorLabels: {{ .honorLabels }}
{{- with .scheme }}
scheme: {{ . }}
{{- end }}
{{- with .tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- /* The relabeling that gives the scraped series the database label, when the values
name one. Takes the root context. */}}
{{- define "pg-liveness-exporter.databaseRelabeling" -}}
{{- with .Values.database }}
# The alerts and dashboards group by database (values: database).
- action: replace
  targetLabel: database
  replacement: {{ . | quote }}
{{- end }}
{{- end }}

{{- /* The DSN Secret as a volume, readable by the pod's group only. Takes a list: the
volume's name and the chart's values. */}}
{{- define "pg-liveness-exporter.dsnVolume" -}}
{{- $v := index . 1 -}}
- name: {{ index . 0 }}
  secret:
    secretName: {{ $v.dsn.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $v.dsn.key }}
        path: dsn
{{- end }}

{{/*
The sidecar shape: what a service's own chart includes to run the agent beside each of
its pods. Each takes this chart's values as your chart sees them, after defaults:
  {{- $pl := index .Values "pg-liveness-exporter" }}
See deploy/examples/checkout/templates/deployment.yaml.
*/}}

{{- /* The pod's securityContext (also the observer's). */}}
{{- define "pg-liveness-exporter.podSecurityContext" -}}
{{- toYaml .podSecurityContext }}
{{- end }}

{{- /* The label that agent.podMonitor selects. */}}
{{- define "pg-liveness-exporter.agent.podLabels" -}}
pg-liveness-exporter/agent: "true"
{{- end }}

{{- define "pg-liveness-exporter.agent.terminationGracePeriodSeconds" -}}
{{- .agent.terminationGracePeriodSeconds }}
{{- end }}

{{- /* An item of the pod's volumes. */}}
{{- define "pg-liveness-exporter.agent.volume" -}}
{{- include "pg-liveness-exporter.dsnVolume" (list "pg-liveness-dsn" .) }}
{{- end }}

{{- /* An item of the pod's containers. The fleet-wide collectors run once, in the
observer; each agent exports only its own state. */}}
{{- define "pg-liveness-exporter.agent.container" -}}
{{- include "pg-liveness-exporter.checkArgs" (list "agent.extraArgs" .agent.extraArgs (list "agent" "agent.instance-id" "agent.service-name" "db.dsn-file" "web.listen-address" "collector.instances" "collector.leases" "collector.advisory_locks" "collector.statements")) }}
{{- include "pg-liveness-exporter.checkEnv" (list "agent.extraEnv" .agent.extraEnv (list "POD_UID" "SERVICE_NAME")) -}}
- name: pg-liveness-exporter
  {{- include "pg-liveness-exporter.image" . | nindent 2 }}
  env:
    - name: POD_UID
      valueFrom:
        fieldRef:
          fieldPath: metadata.uid
    - name: SERVICE_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.labels['app.kubernetes.io/name']
    {{- with .agent.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  args:
    - --db.dsn-file=/etc/pg-liveness-exporter/dsn
    - --agent.instance-id=$(POD_UID)
    - --agent.service-name=$(SERVICE_NAME)
    - --no-collector.instances
    - --no-collector.leases
    - --no-collector.advisory_locks
    - --no-collector.statements
    - --web.listen-address=:9816
    {{- with .agent.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: pg-liveness
      containerPort: 9816
  volumeMounts:
    - name: pg-liveness-dsn
      mountPath: /etc/pg-liveness-exporter
      readOnly: true
    {{- with .agent.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  resources:
    {{- toYaml .agent.resources | nindent 4 }}
  {{- include "pg-liveness-exporter.probes" .agent | nindent 2 }}
  securityContext:
    {{- toYaml .securityContext | nindent 4 }}
{{- end }}

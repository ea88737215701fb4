{{/* Names ---------------------------------------------------------------------------------------------------- */}}

{{- define "hl7gw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<chart>, or <release> when it already contains the chart name; 40 characters leave room for
     the longest suffix (-transformer-config, -ingress-mllp). */}}
{{- define "hl7gw.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The values block of a component: the ingress's is hl7Ingress (chart 0.4.0; `ingress` is left for a
     Kubernetes Ingress), the others are named as the component. Object names, labels and the per-service maps
     (kafka.tls.clientSecrets.ingress, networkPolicy.grpcFrom.ingress, ...) keep the component's name.
     "ingress" -> "hl7Ingress" */}}
{{- define "hl7gw.valuesKey" -}}
{{- if eq . "ingress" }}hl7Ingress{{ else }}{{ . }}{{ end -}}
{{- end -}}

{{/* Values the chart no longer reads, refused with where they went (values.schema.json lets them through so that
     the message can name the new key). */}}
{{- define "hl7gw.checkRenamedValues" -}}
{{- if hasKey .Values "ingress" -}}
{{- fail "ingress: the HL7 ingress's values moved to hl7Ingress in chart 0.4.0 (the key `ingress` is kept for a Kubernetes Ingress): rename the block `ingress:` to `hl7Ingress:` in your values (--set ingress.X=... -> --set hl7Ingress.X=...); see the chart README, Upgrading" -}}
{{- end -}}
{{- if eq (toString (.Values.probes | default dict).readiness) "grpc" -}}
{{- fail "probes.readiness: grpc was removed in chart 0.5.0: readiness is always httpGet /readyz on the admin port, which a flood of gRPC connections cannot fill (the same state as the gRPC health service). Remove probes.readiness; to keep a gRPC probe anyway, set <service>.readinessProbe: {grpc: {port: 50051, service: hl7gw.v1.Ingest}} (Transform, Egress); see the chart README, Upgrading" -}}
{{- end -}}
{{- end -}}

{{/* `anonymous` on an admin method (every grpcAllow method but the ingress's Ingest: Senders, Transform, Status,
     ListDeadLetters, Replay, Trace, and any method added later) lets anyone who reaches the gRPC port call it. With
     plaintext gRPC and no NetworkPolicy that is any pod of the cluster, and anyone on the path: refused unless
     grpc.allowInsecureAnonymous says so (NOTES.txt warns about it in any case). */}}
{{- define "hl7gw.anonymousAdminMethods" -}}
{{- $out := list -}}
{{- range $component := list "ingress" "transformer" "egress" -}}
{{- $v := index $.Values (include "hl7gw.valuesKey" $component) -}}
{{- if $v.enabled -}}
{{- range $method, $who := ($v.grpcAllow | default dict) -}}
{{- if and (ne $method "Ingest") (has "anonymous" $who) -}}
{{- $out = append $out (printf "%s.grpcAllow.%s" (include "hl7gw.valuesKey" $component) $method) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join ", " $out -}}
{{- end -}}

{{- define "hl7gw.checkAnonymousAdmin" -}}
{{- with include "hl7gw.anonymousAdminMethods" . -}}
{{- if and (not $.Values.grpc.tls.secretName) (not $.Values.networkPolicy.enabled) (not $.Values.grpc.allowInsecureAnonymous) -}}
{{- fail (printf "%s: anonymous on an admin method while gRPC is plaintext (grpc.tls.secretName empty) and networkPolicy.enabled is false lets any pod of the cluster call it unauthenticated. Give callers tokens instead (grpc.tokens.existingSecret, token:<name>; the CLI sends them over kubectl port-forward: see the chart README, Operators), or turn on grpc.tls or networkPolicy.enabled, or set grpc.allowInsecureAnonymous: true to accept it" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* dict "root" $ "component" "ingress" -> <fullname>-ingress */}}
{{- define "hl7gw.componentName" -}}
{{- printf "%s-%s" (include "hl7gw.fullname" .root) .component -}}
{{- end -}}

{{- define "hl7gw.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels ---------------------------------------------------------------------------------------------------- */}}

{{- define "hl7gw.labels" -}}
helm.sh/chart: {{ include "hl7gw.chart" . }}
app.kubernetes.io/name: {{ include "hl7gw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "hl7gw.version" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hl7gw
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "hl7gw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hl7gw.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* dict "root" $ "component" "ingress" */}}
{{- define "hl7gw.componentLabels" -}}
{{ include "hl7gw.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image ----------------------------------------------------------------------------------------------------- */}}

{{/* <registry>/<repository>@<digest> or :<tag>; the registry is global.imageRegistry, else image.registry, else
     none (the repository may name one itself). */}}
{{- define "hl7gw.image" -}}
{{- $registry := default .Values.image.registry (.Values.global | default dict).imageRegistry -}}
{{- $repository := .Values.image.repository -}}
{{- if $registry }}{{ $repository = printf "%s/%s" $registry $repository }}{{ end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* app.kubernetes.io/version: the image tag when one is set, else appVersion, as a label value (at most 63
     characters of letters, digits, '-', '_', '.', beginning and ending with a letter or digit; others become _). */}}
{{- define "hl7gw.version" -}}
{{- $v := regexReplaceAll "[^-A-Za-z0-9_.]" (toString (default .Chart.AppVersion .Values.image.tag)) "_" | trunc 63 -}}
{{- regexReplaceAll "^[^A-Za-z0-9]+|[^A-Za-z0-9]+$" $v "" -}}
{{- end -}}

{{/* The pods' imagePullSecrets entries (global.imagePullSecrets, then imagePullSecrets; names or {name} objects,
     each once); empty when there are none. */}}
{{- define "hl7gw.imagePullSecrets" -}}
{{- $names := list -}}
{{- range concat ((.Values.global | default dict).imagePullSecrets | default list) (.Values.imagePullSecrets | default list) -}}
{{- if kindIs "map" . }}{{ $names = append $names .name }}{{ else }}{{ $names = append $names . }}{{ end -}}
{{- end -}}
{{- range $names | uniq }}
- name: {{ . }}
{{- end -}}
{{- end -}}

{{/* The ServiceAccounts: the chart's (name or <fullname>) when created, else the given name or `default`. */}}
{{- define "hl7gw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "hl7gw.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "hl7gw.transformerServiceAccountName" -}}
{{- if .Values.transformer.serviceAccount.create -}}
{{- default (include "hl7gw.componentName" (dict "root" . "component" "transformer")) .Values.transformer.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.transformer.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A probe: the chart's (first) with the component's override (second, <component>.livenessProbe etc.) merged
     over it; a handler in the override (httpGet, grpc, tcpSocket, exec) replaces the chart's handler.
     list $default $override */}}
{{- define "hl7gw.probe" -}}
{{- $probe := deepCopy (index . 0) -}}
{{- $override := index . 1 | default dict -}}
{{- $handlers := list "httpGet" "grpc" "tcpSocket" "exec" -}}
{{- range $h := $handlers -}}
{{- if hasKey $override $h -}}
{{- range $handlers }}{{ $_ := unset $probe . }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $probe (deepCopy $override)) -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: the value, or preStop + drain + 10 s; never at or below preStop + drain. */}}
{{- define "hl7gw.gracePeriod" -}}
{{- $v := .values -}}
{{- $min := add $v.preStopSleepSeconds $v.drainTimeoutSeconds -}}
{{- if $v.terminationGracePeriodSeconds -}}
{{- if le (int $v.terminationGracePeriodSeconds) (int $min) -}}
{{- fail (printf "%s.terminationGracePeriodSeconds (%v) must be more than preStopSleepSeconds + drainTimeoutSeconds (%v): the kubelet would SIGKILL the pod mid-drain" (include "hl7gw.valuesKey" .component) $v.terminationGracePeriodSeconds $min) -}}
{{- end -}}
{{- $v.terminationGracePeriodSeconds -}}
{{- else -}}
{{- add $min 10 -}}
{{- end -}}
{{- end -}}

{{/* Kafka ----------------------------------------------------------------------------------------------------- */}}

{{- define "hl7gw.kafkaSecurityProtocol" -}}
{{- $k := .Values.kafka -}}
{{- if and $k.tls.enabled $k.sasl.enabled -}}SASL_SSL
{{- else if $k.tls.enabled -}}SSL
{{- else if $k.sasl.enabled -}}SASL_PLAINTEXT
{{- else -}}PLAINTEXT
{{- end -}}
{{- end -}}

{{/* One service's Kafka identity, as YAML: username, passwordSecret, clientSecret, oauthClientId,
     oauthSecret (each possibly empty). Per service: <map>.<component>, else <kafka.userPrefix><component> (Strimzi:
     a KafkaUser per service, its Secret named as the user), else the shared value. The user's Secret gives the
     password with SASL, else (TLS only) the client certificate. Fails on an incomplete combination.
     dict "root" $ "component" "ingress" */}}
{{- define "hl7gw.kafkaCredentials" -}}
{{- $k := .root.Values.kafka -}}
{{- $c := .component -}}
{{- $user := "" -}}
{{- if $k.userPrefix }}{{ $user = printf "%s%s" $k.userPrefix $c }}{{ end -}}
{{- $out := dict "username" "" "passwordSecret" "" "clientSecret" "" "oauthClientId" "" "oauthSecret" "" -}}
{{- if and $user (not $k.tls.enabled) (not $k.sasl.enabled) -}}
{{- fail "kafka.userPrefix names the services' Kafka users, which authenticate with SASL (kafka.sasl.enabled) or a TLS client certificate (kafka.tls.enabled): enable one" -}}
{{- end -}}
{{- if $k.tls.enabled -}}
{{- $client := "" -}}
{{- if get $k.tls.clientSecrets $c }}{{ $client = get $k.tls.clientSecrets $c }}{{ else if and $user (not $k.sasl.enabled) }}{{ $client = $user }}{{ else }}{{ $client = $k.tls.clientSecret }}{{ end -}}
{{- $_ := set $out "clientSecret" $client -}}
{{- else if or $k.tls.caSecret $k.tls.clientSecret $k.tls.clientSecrets -}}
{{- fail "kafka.tls.caSecret/clientSecret/clientSecrets are set but kafka.tls.enabled is false: the services would connect without TLS" -}}
{{- end -}}
{{- if $k.sasl.enabled -}}
{{- $s := $k.sasl -}}
{{- if eq $s.mechanism "OAUTHBEARER" -}}
{{- $id := default $s.oauth.clientId (get $s.oauth.clientIds $c) -}}
{{- $sec := default $s.oauth.clientSecretSecret (get $s.oauth.clientSecretSecrets $c) -}}
{{- if not (and $s.oauth.tokenEndpoint $id $sec) -}}
{{- fail (printf "kafka.sasl.mechanism OAUTHBEARER needs kafka.sasl.oauth.tokenEndpoint, a client id (oauth.clientId or oauth.clientIds.%s) and a client secret Secret (oauth.clientSecretSecret or oauth.clientSecretSecrets.%s) for the %s" $c $c $c) -}}
{{- end -}}
{{- $_ := set $out "oauthClientId" $id -}}
{{- $_ := set $out "oauthSecret" $sec -}}
{{- else -}}
{{- if and (eq $s.mechanism "PLAIN") (not $k.tls.enabled) -}}
{{- fail "kafka.sasl.mechanism PLAIN without kafka.tls.enabled would send the password in clear: enable TLS (SASL_SSL) or use SCRAM" -}}
{{- end -}}
{{- $name := "" -}}
{{- if get $s.usernames $c }}{{ $name = get $s.usernames $c }}{{ else if $user }}{{ $name = $user }}{{ else }}{{ $name = $s.username }}{{ end -}}
{{- $secret := "" -}}
{{- if get $s.passwordSecrets $c }}{{ $secret = get $s.passwordSecrets $c }}{{ else if $user }}{{ $secret = $user }}{{ else }}{{ $secret = $s.passwordSecret }}{{ end -}}
{{- if not $name -}}
{{- fail (printf "kafka.sasl is enabled but the %s has no user name: set kafka.sasl.username, kafka.sasl.usernames.%s or kafka.userPrefix" $c $c) -}}
{{- end -}}
{{- if not $secret -}}
{{- fail (printf "kafka.sasl is enabled but the %s has no password Secret: set kafka.sasl.passwordSecret, kafka.sasl.passwordSecrets.%s or kafka.userPrefix (Strimzi: the KafkaUser's Secret)" $c $c) -}}
{{- end -}}
{{- $_ := set $out "username" $name -}}
{{- $_ := set $out "passwordSecret" $secret -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The `kafka` block of a service's config: topic creation, non-secret librdkafka properties and
     kafka.security (secrets as paths of mounted Secret files). dict "root" $ "component" "ingress" */}}
{{- define "hl7gw.kafkaConfig" -}}
{{- $k := .root.Values.kafka -}}
{{- $cred := include "hl7gw.kafkaCredentials" . | fromYaml -}}
{{- $sec := dict "protocol" (include "hl7gw.kafkaSecurityProtocol" .root) -}}
{{- if $k.tls.enabled -}}
{{- if $k.tls.caSecret }}{{ $_ := set $sec "ca_file" (printf "/etc/hl7gw/kafka/ca/%s" $k.tls.caKey) }}{{ end -}}
{{- if $cred.clientSecret -}}
{{- $_ := set $sec "cert_file" (printf "/etc/hl7gw/kafka/client/%s" $k.tls.certKey) -}}
{{- $_ := set $sec "key_file" (printf "/etc/hl7gw/kafka/client/%s" $k.tls.keyKey) -}}
{{- if $k.tls.keyPasswordKey }}{{ $_ := set $sec "key_password_file" (printf "/etc/hl7gw/kafka/client/%s" $k.tls.keyPasswordKey) }}{{ end -}}
{{- end -}}
{{- $_ := set $sec "verify_hostname" $k.tls.verifyHostname -}}
{{- end -}}
{{- if $k.sasl.enabled -}}
{{- $_ := set $sec "sasl_mechanism" $k.sasl.mechanism -}}
{{- if eq $k.sasl.mechanism "OAUTHBEARER" -}}
{{- $_ := set $sec "oauth_token_endpoint" $k.sasl.oauth.tokenEndpoint -}}
{{- $_ := set $sec "oauth_client_id" $cred.oauthClientId -}}
{{- $_ := set $sec "oauth_client_secret_file" "/etc/hl7gw/kafka/oauth/client-secret" -}}
{{- if $k.sasl.oauth.scope }}{{ $_ := set $sec "oauth_scope" $k.sasl.oauth.scope }}{{ end -}}
{{- else -}}
{{- $_ := set $sec "username" $cred.username -}}
{{- $_ := set $sec "password_file" "/etc/hl7gw/kafka/sasl/password" -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "brokers" $k.brokers "create_topics_partitions" (int $k.createTopicsPartitions) "replication_factor" (int $k.replicationFactor) "min_insync_replicas" (int $k.minInsyncReplicas) "max_message_bytes" (int $k.maxMessageBytes) "properties" $k.properties "security" $sec) -}}
{{- end -}}

{{/* The `grpc` block of a service's config (TLS, static tokens, Kubernetes auth, who may call what); empty when
     nothing is set. kubernetes_auth is written only when on. dict "root" $ "component" "ingress" */}}
{{- define "hl7gw.grpcConfig" -}}
{{- $g := .root.Values.grpc -}}
{{- $out := dict -}}
{{- if $g.tls.secretName -}}
{{- $tls := dict "cert" "/etc/hl7gw/grpc-tls/tls.crt" "key" "/etc/hl7gw/grpc-tls/tls.key" -}}
{{- if $g.tls.clientCAKey }}{{ $_ := set $tls "client_ca" (printf "/etc/hl7gw/grpc-client-ca/%s" $g.tls.clientCAKey) }}{{ end -}}
{{- $_ := set $out "tls" $tls -}}
{{- else if $g.tls.clientCAKey -}}
{{- fail "grpc.tls.clientCAKey (client certificates) needs grpc.tls.secretName (the server certificate)" -}}
{{- end -}}
{{- if $g.tokens.existingSecret }}{{ $_ := set $out "tokens_file" "/etc/hl7gw/grpc-tokens/tokens" }}{{ end -}}
{{- if $g.kubernetesAuth }}{{ $_ := set $out "kubernetes_auth" true }}{{ end -}}
{{- with (index .root.Values (include "hl7gw.valuesKey" .component)).grpcAllow }}{{ $_ := set $out "allow" . }}{{ end -}}
{{- if $out }}{{ toYaml $out }}{{ end -}}
{{- end -}}

{{/* The service: section every service's config has (listeners, drain, logs). */}}
{{- define "hl7gw.serviceConfig" -}}
{{- $v := .root.Values -}}
{{- toYaml (dict
  "grpc_addr" (printf "0.0.0.0:%v" $v.ports.grpc)
  "admin_addr" (printf "0.0.0.0:%v" $v.ports.admin)
  "drain_timeout" (printf "%vs" (index $v (include "hl7gw.valuesKey" .component)).drainTimeoutSeconds)
  "log_json" $v.logging.json) -}}
{{- end -}}

{{/* Service configs: what the chart sets, then <component>.config over it. -------------------------------------- */}}

{{- define "hl7gw.config.ingress" -}}
{{- $v := .Values -}}
{{- $c := dict
  "mllp_addr" (printf "0.0.0.0:%v" $v.ports.mllp)
  "inbound_topic" $v.kafka.topics.inbound
  "dlq_topic" $v.kafka.topics.dlq
  "service" (include "hl7gw.serviceConfig" (dict "root" . "component" "ingress") | fromYaml)
  "kafka" (include "hl7gw.kafkaConfig" (dict "root" . "component" "ingress") | fromYaml)
-}}
{{- with $v.hl7Ingress.tls -}}
{{- if .enabled -}}
{{- $tls := dict "cert" "/etc/hl7gw/tls/tls.crt" "key" "/etc/hl7gw/tls/tls.key" -}}
{{- if .clientCAKey }}{{ $_ := set $tls "client_ca" (printf "/etc/hl7gw/client-ca/%s" .clientCAKey) }}{{ end -}}
{{- $_ := set $c "tls" $tls -}}
{{- end -}}
{{- end -}}
{{- with include "hl7gw.grpcConfig" (dict "root" . "component" "ingress") }}{{ $_ := set $c "grpc" (fromYaml .) }}{{ end -}}
{{- /* hl7Ingress.senders (camelCase, with the alert's silentAfter) as the ingress's senders: key. */ -}}
{{- if $v.hl7Ingress.senders -}}
{{- $senders := list -}}
{{- $names := dict -}}
{{- range $v.hl7Ingress.senders -}}
{{- if hasKey $names .name }}{{ fail (printf "hl7Ingress.senders: the name %s is used twice" .name) }}{{ end -}}
{{- $_ := set $names .name true -}}
{{- $s := dict "name" .name "sending_application" .sendingApplication -}}
{{- with .sendingFacility }}{{ $_ := set $s "sending_facility" . }}{{ end -}}
{{- $senders = append $senders $s -}}
{{- end -}}
{{- $_ := set $c "senders" $senders -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $c (deepCopy $v.hl7Ingress.config)) -}}
{{- end -}}

{{/* The ledger section of the transformer's and the egress's configs (kafka.topics.events, eventsRetention). */}}
{{- define "hl7gw.ledgerConfig" -}}
topic: {{ .Values.kafka.topics.events | default "" | quote }}
retention: {{ .Values.kafka.topics.eventsRetention | default "30d" | quote }}
{{- end -}}

{{- define "hl7gw.config.transformer" -}}
{{- $v := .Values -}}
{{- $routes := dict "kubernetes" (eq $v.transformer.routes.source "kubernetes") -}}
{{- if eq $v.transformer.routes.source "file" }}{{ $routes = dict "file" "/etc/hl7gw/routes/routes.yaml" }}{{ end -}}
{{- $c := dict
  "inbound_topic" $v.kafka.topics.inbound
  "dlq_topic" $v.kafka.topics.dlq
  "out_topic_prefix" $v.kafka.topics.outPrefix
  "routes" $routes
  "service" (include "hl7gw.serviceConfig" (dict "root" . "component" "transformer") | fromYaml)
  "kafka" (include "hl7gw.kafkaConfig" (dict "root" . "component" "transformer") | fromYaml)
-}}
{{- if $v.transformer.defaultDestination }}{{ $_ := set $c "default_destination" $v.transformer.defaultDestination }}{{ end -}}
{{- $_ := set $c "ledger" (include "hl7gw.ledgerConfig" . | fromYaml) -}}
{{- with include "hl7gw.grpcConfig" (dict "root" . "component" "transformer") }}{{ $_ := set $c "grpc" (fromYaml .) }}{{ end -}}
{{- toYaml (mustMergeOverwrite $c (deepCopy $v.transformer.config)) -}}
{{- end -}}

{{- /* The rules of an egress destination that values.schema.json cannot state clearly (the egress checks them too,
at start; here they fail the install instead of a pod). */ -}}
{{- define "hl7gw.checkDestination" -}}
{{- $n := .name -}}{{- $d := .d -}}
{{- if and $d.address $d.url -}}
{{- fail (printf "egress.destinations.%s: set address (MLLP host:port) or url (HTTP), not both" $n) -}}
{{- end -}}
{{- if and $d.http (not $d.url) -}}
{{- fail (printf "egress.destinations.%s.http: for HTTP(S) destinations (url) only; an MLLP destination (address) has no http settings" $n) -}}
{{- end -}}
{{- if $d.url -}}
{{- $https := hasPrefix "https://" $d.url -}}
{{- if and $d.tls (not $https) -}}
{{- fail (printf "egress.destinations.%s.tls: for https:// urls only (%s is plain http)" $n $d.url) -}}
{{- end -}}
{{- with $d.http -}}
{{- if and .bearer_token_secret .oauth2 -}}
{{- fail (printf "egress.destinations.%s.http: bearer_token_secret or oauth2, not both" $n) -}}
{{- end -}}
{{- if and (or .bearer_token_secret .oauth2) (not $https) (not (regexMatch "^http://(localhost|127\\.0\\.0\\.1|\\[::1\\])([:/?]|$)" $d.url)) -}}
{{- fail (printf "egress.destinations.%s.http: credentials (bearer_token_secret, oauth2) are sent over https:// only (or to localhost), not to %s" $n $d.url) -}}
{{- end -}}
{{- range $h, $_ := .headers -}}
{{- if has (lower $h) (list "authorization" "content-type" "host") -}}
{{- fail (printf "egress.destinations.%s.http.headers: %s is set by the egress (credentials: bearer_token_secret or oauth2; content_type)" $n $h) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hl7gw.config.egress" -}}
{{- $v := .Values -}}
{{- $dests := dict -}}
{{- range $name, $d := $v.egress.destinations -}}
{{- include "hl7gw.checkDestination" (dict "name" $name "d" $d) -}}
{{- $out := omit $d "tls" "http" -}}
{{- with $d.tls -}}
{{- $tls := dict "ca" (printf "/etc/hl7gw/destinations/%s/%s" $name (default "ca.crt" .ca_key)) -}}
{{- if .client_certificate -}}
{{- $_ := set $tls "cert" (printf "/etc/hl7gw/destinations/%s/%s" $name (default "tls.crt" .cert_key)) -}}
{{- $_ := set $tls "key" (printf "/etc/hl7gw/destinations/%s/%s" $name (default "tls.key" .key_key)) -}}
{{- end -}}
{{- with .server_name }}{{ $_ := set $tls "server_name" . }}{{ end -}}
{{- $_ := set $out "tls" $tls -}}
{{- end -}}
{{- with $d.http -}}
{{- /* Secrets become paths of the destination's mounted directory (deployment.yaml), never values here. */ -}}
{{- $http := omit . "bearer_token_secret" "oauth2" -}}
{{- if .bearer_token_secret -}}
{{- $_ := set $http "bearer_token_file" (printf "/etc/hl7gw/destinations/%s/bearer-token" $name) -}}
{{- end -}}
{{- with .oauth2 -}}
{{- $o := omit . "private_key_secret" -}}
{{- $_ := set $o "private_key" (printf "/etc/hl7gw/destinations/%s/oauth2-private-key.pem" $name) -}}
{{- $_ := set $http "oauth2" $o -}}
{{- end -}}
{{- $_ := set $out "http" $http -}}
{{- end -}}
{{- $_ := set $dests $name $out -}}
{{- end -}}
{{- $c := dict
  "out_topic_prefix" $v.kafka.topics.outPrefix
  "dlq_topic" $v.kafka.topics.dlq
  "inbound_topic" $v.kafka.topics.inbound
  "destinations" $dests
  "service" (include "hl7gw.serviceConfig" (dict "root" . "component" "egress") | fromYaml)
  "kafka" (include "hl7gw.kafkaConfig" (dict "root" . "component" "egress") | fromYaml)
-}}
{{- $_ := set $c "ledger" (include "hl7gw.ledgerConfig" . | fromYaml) -}}
{{- with include "hl7gw.grpcConfig" (dict "root" . "component" "egress") }}{{ $_ := set $c "grpc" (fromYaml .) }}{{ end -}}
{{- toYaml (mustMergeOverwrite $c (deepCopy $v.egress.config)) -}}
{{- end -}}

{{/* An alert's runbook_url: <metrics.prometheusRule.runbookBaseUrl>#<alert name in lower case> (the sections of
     docs/runbook.md); empty when no base URL is set. list $ "HL7GWHighNakRate" */}}
{{- define "hl7gw.runbookUrl" -}}
{{- with (index . 0).Values.metrics.prometheusRule.runbookBaseUrl -}}
{{- printf "%s#%s" (trimSuffix "#" .) (lower (index $ 1)) | quote -}}
{{- end -}}
{{- end -}}

{{/* The Grafana dashboard's uid, unique per release and at most Grafana's 40 characters: hl7gw-, the namespace and
     release (cut to 23 characters), and 10 hex digits of the hash of <namespace>/<release> (what keeps two long
     names that share a beginning apart). */}}
{{- define "hl7gw.dashboardUid" -}}
{{- $readable := printf "%s-%s" .Release.Namespace .Release.Name | trunc 23 | trimSuffix "-" -}}
{{- printf "hl7gw-%s-%s" $readable (printf "%s/%s" .Release.Namespace .Release.Name | sha256sum | trunc 10) -}}
{{- end -}}

{{/* Consumer groups, as the services derive them (for KEDA's kafka scaler). */}}
{{- define "hl7gw.transformerGroup" -}}
{{- default "hl7gw-transformer" .Values.transformer.config.group_id -}}
{{- end -}}
{{- define "hl7gw.egressGroupPrefix" -}}
{{- default "hl7gw-egress" .Values.egress.config.group_prefix -}}
{{- end -}}

{{/* Autoscaling bounds: min <= max, workers' max <= partitions (more consumers than partitions idle). */}}
{{- define "hl7gw.checkAutoscaling" -}}
{{- $a := .values.autoscaling -}}
{{- if gt (int $a.minReplicas) (int $a.maxReplicas) -}}
{{- fail (printf "%s.autoscaling.minReplicas (%v) is above maxReplicas (%v)" (include "hl7gw.valuesKey" .component) $a.minReplicas $a.maxReplicas) -}}
{{- end -}}
{{- if and (eq .component "transformer") (gt (int $a.maxReplicas) (int .root.Values.kafka.inboundPartitions)) -}}
{{- fail (printf "transformer.autoscaling.maxReplicas (%v) is above kafka.inboundPartitions (%v): a consumer group gives each partition to one member, so extra transformer pods would idle" $a.maxReplicas .root.Values.kafka.inboundPartitions) -}}
{{- end -}}
{{- if and (eq .component "egress") (gt (int $a.maxReplicas) (int .root.Values.kafka.outPartitions)) -}}
{{- fail (printf "egress.autoscaling.maxReplicas (%v) is above kafka.outPartitions (%v): extra egress pods would idle" $a.maxReplicas .root.Values.kafka.outPartitions) -}}
{{- end -}}
{{- end -}}

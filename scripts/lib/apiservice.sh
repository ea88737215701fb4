# An aggregated API served by a process on this machine (sourced by scripts/node.sh, for metrics-server, and
# scripts/keda.sh, for KEDA's metrics server, after they define `kubectl` and `die` and set NODE_GATEWAY).

# register_apiservice GROUP NAME NAMESPACE PORT LOG: the APIService v1beta1.GROUP, behind a Service NAME without
# selector in NAMESPACE whose Endpoints name this machine ($NODE_GATEWAY:PORT; the API server calls endpoints
# directly), skipping the verification of the server's self-signed certificate. kubectl warns that v1 Endpoints are
# deprecated: the warning goes to the file LOG, errors stop here.
register_apiservice() {
  local group=$1 name=$2 namespace=$3 port=$4 errs=$5
  kubectl apply -f - >/dev/null 2>"$errs" <<YAML || { cat "$errs" >&2; die "the $group APIService"; }
apiVersion: v1
kind: Service
metadata: {name: $name, namespace: $namespace}
spec:
  ports: [{name: https, port: 443, targetPort: $port}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: $name, namespace: $namespace}
subsets:
  - addresses: [{ip: $NODE_GATEWAY}]
    ports: [{name: https, port: $port}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.$group}
spec:
  service: {name: $name, namespace: $namespace, port: 443}
  group: $group
  version: v1beta1
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
YAML
}

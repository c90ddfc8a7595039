package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// envoyProto decodes a patch value (JSON) into the Envoy type it stands
// for, strictly (unknown fields and unresolvable @types fail), and
// validates it with the type's own rules.
func envoyProto(t *testing.T, what string, v any, into proto.Message) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: not a %T: %v\n%s", what, into, err, b)
	}
	if val, ok := into.(interface{ ValidateAll() error }); ok {
		if err := val.ValidateAll(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// deploy/envoy-gateway decodes strictly as Envoy Gateway's own API types:
// the route role's ext_proc (buffered request body, streamed response,
// mode override, the fusebox metadata namespace, fail open), the access log
// channel as an ALS sink to fusebox, and patches whose values are the
// Envoy route and early header mutation they claim to be.
func TestEnvoyGatewayPolicies(t *testing.T) {
	raw := read(t, "deploy/envoy-gateway/fusebox.yaml")
	byKind := docs(t, map[string]string{"fusebox.yaml": string(raw)})
	var ext egv1a1.EnvoyExtensionPolicy
	strict(t, byKind["EnvoyExtensionPolicy"][0], &ext)
	ep := ext.Spec.ExtProc[0]
	pm := ep.ProcessingMode
	if pm == nil || !pm.AllowModeOverride || pm.Request == nil || *pm.Request.Body != egv1a1.BufferedExtProcBodyProcessingMode ||
		pm.Response == nil || *pm.Response.Body != egv1a1.StreamedExtProcBodyProcessingMode || ep.FailOpen == nil || !*ep.FailOpen ||
		ep.Metadata == nil || strings.Join(ep.Metadata.WritableNamespaces, ",") != "fusebox" ||
		strings.Join(pm.Response.Attributes, ",") != "response.flags,response.code_details" {
		t.Errorf("ext_proc %+v", ep)
	}
	var proxy egv1a1.EnvoyProxy
	strict(t, byKind["EnvoyProxy"][0], &proxy)
	sink := proxy.Spec.Telemetry.AccessLog.Settings[0].Sinks[0]
	if sink.Type != egv1a1.ProxyAccessLogSinkTypeALS || sink.ALS == nil || sink.ALS.BackendRefs[0].Name != "gw-fusebox" {
		t.Errorf("access log sink %+v", sink)
	}
	// The EnvoyProxy is attached (an unreferenced one is never applied),
	// and carries the runtime layer Envoy 1.35/1.36 need (EG v1.5, v1.6).
	var gw gwapiv1.Gateway
	strict(t, byKind["Gateway"][0], &gw)
	ref := gw.Spec.Infrastructure
	if ref == nil || ref.ParametersRef == nil || string(ref.ParametersRef.Kind) != "EnvoyProxy" ||
		string(ref.ParametersRef.Group) != "gateway.envoyproxy.io" || ref.ParametersRef.Name != proxy.Name {
		t.Errorf("the Gateway does not attach EnvoyProxy %q: %+v", proxy.Name, ref)
	}
	if ext.Spec.TargetRefs[0].Name != gwapiv1.ObjectName(gw.Name) {
		t.Errorf("the policy targets %q, the Gateway is %q", ext.Spec.TargetRefs[0].Name, gw.Name)
	}
	bs := proxy.Spec.Bootstrap
	if bs == nil || bs.Type == nil || *bs.Type != egv1a1.BootstrapTypeMerge || bs.Value == nil {
		t.Fatalf("EnvoyProxy bootstrap %+v", bs)
	}
	var boot bootstrapv3.Bootstrap
	var bv any
	if err := yaml.Unmarshal([]byte(*bs.Value), &bv); err != nil {
		t.Fatal(err)
	}
	envoyProto(t, "the bootstrap merge", bv, &boot)
	guard := false
	for _, l := range boot.GetLayeredRuntime().GetLayers() {
		if f := l.GetStaticLayer().GetFields()["envoy.reloadable_features.skip_ext_proc_on_local_reply"]; f != nil && !f.GetBoolValue() {
			guard = true
		}
	}
	if !guard {
		t.Error("the EnvoyProxy bootstrap does not turn skip_ext_proc_on_local_reply off (Envoy 1.35/1.36 in EG v1.5/v1.6)")
	}
	var patch egv1a1.EnvoyPatchPolicy
	strict(t, byKind["EnvoyPatchPolicy"][0], &patch)
	for _, p := range patch.Spec.JSONPatches {
		var v any
		if err := json.Unmarshal(p.Operation.Value.Raw, &v); err != nil {
			t.Fatal(err)
		}
		switch p.Type {
		case "type.googleapis.com/envoy.config.route.v3.RouteConfiguration":
			var r routev3.Route
			envoyProto(t, "the cluster_header route", v, &r)
			if r.GetRoute().GetClusterHeader() != "x-fusebox-cluster" {
				t.Errorf("route %v", &r)
			}
			// #54: the provider gets its own Host (before, the client's:
			// a provider behind a shared front end answers 404 or 421).
			if !r.GetRoute().GetAutoHostRewrite().GetValue() {
				t.Error("the cluster_header route has no auto_host_rewrite: providers get the gateway's Host")
			}
			removesFuseboxHeaders(t, "Envoy Gateway", r.GetRequestHeadersToRemove())
		case "type.googleapis.com/envoy.config.listener.v3.Listener":
			for _, e := range v.([]any) {
				var ext corev3.TypedExtensionConfig
				envoyProto(t, "early header mutation", e, &ext)
				stripsFuseboxPrefix(t, "Envoy Gateway", &ext)
			}
		default:
			t.Errorf("unexpected patch type %s", p.Type)
		}
	}
	egProvidersHaveKeys(t, byKind)
	// A misspelt field fails the strict decode.
	bad := bytes.Replace(byKind["EnvoyExtensionPolicy"][0], []byte("failOpen: true"), []byte("failOpn: true"), 1)
	if err := yaml.UnmarshalStrict(bad, &egv1a1.EnvoyExtensionPolicy{}); err == nil {
		t.Error("a misspelt field was accepted")
	}
}

// deploy/istio decodes as Istio's EnvoyFilter type, and each patch value
// as the Envoy type it inserts or merges: the route role's ext_proc (the
// shipped envoy.yaml's modes), the cluster_header route inserted first, and
// the connection manager's header stripping and access log channel.
func TestIstioEnvoyFilter(t *testing.T) {
	var ef istionet.EnvoyFilter
	strict(t, read(t, "deploy/istio/envoyfilter.yaml"), &ef)
	patches := ef.Spec.GetConfigPatches()
	if len(patches) != 3 {
		t.Fatalf("%d patches", len(patches))
	}
	for _, p := range patches {
		v := p.GetPatch().GetValue().AsMap()
		switch p.GetApplyTo().String() {
		case "HTTP_FILTER":
			var f hcmv3.HttpFilter
			envoyProto(t, "ext_proc filter", v, &f)
			if p.GetPatch().GetOperation().String() != "INSERT_BEFORE" || f.GetName() != "envoy.filters.http.ext_proc" {
				t.Errorf("filter patch %v", p)
			}
		case "HTTP_ROUTE":
			var r routev3.Route
			envoyProto(t, "cluster_header route", v, &r)
			if p.GetPatch().GetOperation().String() != "INSERT_FIRST" || r.GetRoute().GetClusterHeader() != "x-fusebox-cluster" {
				t.Errorf("route patch %v", p)
			}
			removesFuseboxHeaders(t, "Istio", r.GetRequestHeadersToRemove())
			// Whatever port the Gateway's server listens on: a match on
			// one port silently skips every other (the route is never
			// inserted and fusebox's choice ignored).
			if rc := p.GetMatch().GetRouteConfiguration(); rc.GetPortNumber() != 0 || rc.GetPortName() != "" {
				t.Errorf("the fusebox route is inserted only for port %d %q", rc.GetPortNumber(), rc.GetPortName())
			}
		case "NETWORK_FILTER":
			// A partial connection manager (a merge): decoded strictly,
			// not validated as a whole one.
			var a anypb.Any
			envoyProto(t, "connection manager merge", v["typed_config"], &a)
			var hcm hcmv3.HttpConnectionManager
			if err := a.UnmarshalTo(&hcm); err != nil {
				t.Fatal(err)
			}
			if len(hcm.GetAccessLog()) != 1 || len(hcm.GetEarlyHeaderMutationExtensions()) != 1 {
				t.Errorf("connection manager merge %v", &hcm)
			}
			for _, ext := range hcm.GetEarlyHeaderMutationExtensions() {
				stripsFuseboxPrefix(t, "Istio", ext)
			}
		default:
			t.Errorf("unexpected applyTo %s", p.GetApplyTo())
		}
	}
}

// fuseboxSets are the headers fusebox sets on a request (routes' header
// defaults and the attempt role's chain): none may reach a provider.
var fuseboxSets = []string{"x-fusebox-cluster", "x-fusebox-route", "x-fusebox-fallbacks", "x-fusebox-attempt",
	"x-fusebox-gateway", "x-fusebox-model", "x-fusebox-residency"}

func removesFuseboxHeaders(t *testing.T, where string, removed []string) {
	t.Helper()
	have := map[string]bool{}
	for _, h := range removed {
		have[h] = true
	}
	for _, h := range fuseboxSets {
		if !have[h] {
			t.Errorf("%s: %s reaches the provider (request_headers_to_remove %v)", where, h, removed)
		}
	}
}

// stripsFuseboxPrefix: the early header mutation removes every client
// header of fusebox's prefix, not a list of names that misses new ones.
func stripsFuseboxPrefix(t *testing.T, where string, ext *corev3.TypedExtensionConfig) {
	t.Helper()
	var hm earlyv3.HeaderMutation
	if err := ext.GetTypedConfig().UnmarshalTo(&hm); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	for _, m := range hm.GetMutations() {
		if m.GetRemoveOnMatch().GetKeyMatcher().GetPrefix() == "x-fusebox-" {
			return
		}
	}
	t.Errorf("%s: the early header mutation does not strip the x-fusebox- prefix: %v", where, &hm)
}

// egProvidersHaveKeys (#54): every provider HTTPRoute of the Envoy Gateway
// example carries its key where fusebox's cluster_header route passes
// too: a credentialInjection filter on the backendRef (Envoy Gateway puts
// it in that backendRef's own cluster, .../backend/0); the filter names a
// Secret of the file that has the "credential" key Envoy Gateway reads;
// the Backend speaks TLS to the provider's host; and the cluster names
// docs/clusters.md tells users to write are the ones those routes make.
func egProvidersHaveKeys(t *testing.T, byKind map[string][][]byte) {
	t.Helper()
	secrets := map[string]corev1.Secret{}
	for _, b := range byKind["Secret"] {
		var s corev1.Secret
		strict(t, b, &s)
		secrets[s.Name] = s
	}
	filters := map[string]egv1a1.HTTPRouteFilter{}
	for _, b := range byKind["HTTPRouteFilter"] {
		var f egv1a1.HTTPRouteFilter
		strict(t, b, &f)
		filters[f.Name] = f
	}
	backends := map[string]egv1a1.Backend{}
	for _, b := range byKind["Backend"] {
		var be egv1a1.Backend
		strict(t, b, &be)
		backends[be.Name] = be
	}
	clusters := map[string]bool{}
	for _, b := range byKind["HTTPRoute"] {
		var r gwapiv1.HTTPRoute
		strict(t, b, &r)
		if len(r.Spec.Rules) != 1 || len(r.Spec.Rules[0].BackendRefs) != 1 {
			t.Errorf("HTTPRoute %s: want one rule with one backendRef (one cluster a provider)", r.Name)
			continue
		}
		ref := r.Spec.Rules[0].BackendRefs[0]
		keyed := false
		for _, f := range ref.Filters {
			if f.ExtensionRef == nil || f.ExtensionRef.Kind != "HTTPRouteFilter" {
				continue
			}
			ci := filters[string(f.ExtensionRef.Name)].Spec.CredentialInjection
			if ci == nil {
				t.Errorf("HTTPRoute %s: filter %s injects no credential", r.Name, f.ExtensionRef.Name)
				continue
			}
			s, ok := secrets[string(ci.Credential.ValueRef.Name)]
			if _, has := s.StringData["credential"]; !ok || !has {
				t.Errorf("HTTPRoute %s: Secret %q with key \"credential\" is not in the file", r.Name, ci.Credential.ValueRef.Name)
			}
			keyed = true
		}
		if !keyed {
			t.Errorf("HTTPRoute %s: no credentialInjection on its backendRef; fusebox's route would reach the provider with no key", r.Name)
		}
		be, ok := backends[string(ref.Name)]
		if !ok || be.Spec.TLS == nil || len(be.Spec.Endpoints) != 1 || be.Spec.Endpoints[0].FQDN == nil ||
			be.Spec.TLS.SNI == nil || string(*be.Spec.TLS.SNI) != be.Spec.Endpoints[0].FQDN.Hostname {
			t.Errorf("HTTPRoute %s: Backend %q missing, or without TLS to its own host", r.Name, ref.Name)
		}
		// A backendRef with filters is a cluster of its own (Envoy
		// Gateway's NeedsClusterPerSetting, irDestinationSettingName).
		clusters[fmt.Sprintf("httproute/%s/%s/rule/0/backend/0", r.Namespace, r.Name)] = true
	}
	if len(clusters) < 2 {
		t.Fatalf("provider HTTPRoutes: %v", clusters)
	}
	doc := string(read(t, "docs/clusters.md"))
	sec := doc[strings.Index(doc, "## Envoy Gateway"):]
	sec = sec[:strings.Index(sec, "\n## ")+1]
	for _, m := range regexp.MustCompile(`cluster: (httproute/\S+?)[,}]`).FindAllStringSubmatch(sec, -1) {
		if !clusters[m[1]] {
			t.Errorf("docs/clusters.md names cluster %s; the example's routes make %v", m[1], clusters)
		}
	}
}

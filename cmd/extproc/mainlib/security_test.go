package mainlib

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fusebox-llm/fusebox/pkg/tlsfiles/tlstest"
)

// startConfig starts fusebox on the embedded default config with extra
// top-level YAML prepended (limits, listen.tls).
func startConfig(t *testing.T, extra string, logs io.Writer) *Instance {
	t.Helper()
	return startEdited(t, func(doc string) string { return strings.Replace(doc, "store:\n", extra+"store:\n", 1) }, logs)
}

// startEdited starts fusebox on the embedded default config edited by edit.
func startEdited(t *testing.T, edit func(string) string, logs io.Writer) *Instance {
	t.Helper()
	good, err := os.ReadFile("../../../pkg/routes/default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := edit(string(good))
	path := filepath.Join(t.TempDir(), "fusebox.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in, err := Start(ctx, []string{"-config", path, "-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-grace-period", "0s"}, logs)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = in.Wait() })
	return in
}

func bodyOf(model string, size int) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"` + model + `","messages":[{"role":"user","content":"`)
	for b.Len() < size-8 {
		b.WriteString("lorem ipsum ")
	}
	b.WriteString(`"}]}`)
	return []byte(b.String())
}

// requestBody runs headers (no model header) then one buffered body, as
// Envoy does, and returns the body reply or the stream's error.
func requestBody(t *testing.T, conn *grpc.ClientConn, body []byte) (*extprocv3.ProcessingResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx, grpc.MaxCallSendMsgSize(64<<20))
	if err != nil {
		return nil, err
	}
	hdrs := &corev3.HeaderMap{}
	for _, kv := range [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {"content-type", "application/json"}} {
		hdrs.Headers = append(hdrs.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	if err := s.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}},
	}); err != nil {
		return nil, err
	}
	if _, err := s.Recv(); err != nil {
		return nil, err
	}
	if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		return nil, err
	}
	return s.Recv()
}

func cluster(r *extprocv3.ProcessingResponse) string {
	for _, h := range r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.Header.Key == "x-fusebox-cluster" {
			return string(h.Header.RawValue)
		}
	}
	return ""
}

// R-L1: a body above gRPC's default 4 MiB (and below Envoy's 16 MiB buffer)
// is decided; one over limits.max_message_bytes is refused, counted and
// logged, never silently.
func TestLargeBodiesAreDecidedOrCounted(t *testing.T) {
	logs := &syncBuffer{}
	in := startConfig(t, "limits: {max_message_bytes: 16842752}\n", logs)
	conn, err := grpc.NewClient(in.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, err := requestBody(t, conn, bodyOf("gpt-4o-mini", 5<<20))
	if err != nil {
		t.Fatalf("a 5 MiB body: %v", err)
	}
	if cluster(r) == "" {
		t.Fatalf("a 5 MiB body was not routed: %v", r)
	}
	r, err = requestBody(t, conn, bodyOf("gpt-4o-mini", 15<<20))
	if err != nil || cluster(r) == "" {
		t.Fatalf("a 15 MiB body: %v %v", r, err)
	}
	_, err = requestBody(t, conn, bodyOf("gpt-4o-mini", 17<<20))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 17 MiB message over the 16.06 MiB limit: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, m := get(t, "http://"+in.AdminAddr()+"/metrics", "")
		if strings.Contains(m, `fusebox_refused_total{what="message_too_large"} 1`) && strings.Contains(logs.String(), "over limits.max_message_bytes") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refused message was not counted and logged:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// R-L6: streams beyond limits.max_concurrent_streams are refused and
// counted; the admin server has its timeouts.
func TestStreamLimit(t *testing.T) {
	in := startConfig(t, "limits: {max_concurrent_streams: 2}\n", &syncBuffer{})
	// Each connection is also held to the limit by HTTP/2's own setting,
	// so the third stream comes on a second connection, as from a second
	// Envoy worker.
	var clients []extprocv3.ExternalProcessorClient
	for i := 0; i < 2; i++ {
		conn, err := grpc.NewClient(in.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		clients = append(clients, extprocv3.NewExternalProcessorClient(conn))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var streams []extprocv3.ExternalProcessor_ProcessClient
	for i := 0; i < 3; i++ {
		s, err := clients[i/2].Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}})
		streams = append(streams, s)
		if i < 2 {
			if _, err := s.Recv(); err != nil {
				t.Fatalf("stream %d: %v", i, err)
			}
		}
	}
	if _, err := streams[2].Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream: %v", err)
	}
	if _, m := get(t, "http://"+in.AdminAddr()+"/metrics", ""); !strings.Contains(m, `fusebox_refused_total{what="stream_limit"} 1`) {
		t.Fatal("the refused stream was not counted")
	}
	srv := adminHTTPServer(http.NotFoundHandler())
	if srv.IdleTimeout == 0 || srv.ReadTimeout == 0 || srv.WriteTimeout == 0 || srv.ReadHeaderTimeout == 0 {
		t.Fatalf("admin server without timeouts: %+v", srv)
	}
}

// R-L5: both listeners over TLS, ext_proc with mutual TLS.
func TestListenersServeTLS(t *testing.T) {
	f := tlstest.New(t, t.TempDir(), 1)
	in := startEdited(t, func(doc string) string {
		return strings.Replace(doc, "listen:\n", fmt.Sprintf("listen:\n  tls: {cert_file: %q, key_file: %q, client_ca_file: %q}\n", f.ServerCert, f.ServerKey, f.CA), 1)
	}, &syncBuffer{})
	// Admin over HTTPS.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.CAPool}}}
	resp, err := hc.Get("https://" + in.AdminAddr() + "/healthz")
	if err != nil {
		t.Fatalf("admin over TLS: %v", err)
	}
	resp.Body.Close()
	// A plaintext request to the TLS listener is never served (Go answers
	// it with a 400).
	if r, err := http.Get("http://" + in.AdminAddr() + "/healthz"); err == nil {
		r.Body.Close()
		if r.StatusCode == 200 {
			t.Fatal("the admin listener served plaintext")
		}
	}
	// ext_proc: a client with a certificate from the CA is served...
	cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	good, _ := grpc.NewClient(in.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: f.CAPool, Certificates: []tls.Certificate{cert}})))
	defer good.Close()
	r, err := requestBody(t, good, bodyOf("gpt-4o-mini", 100))
	if err != nil || cluster(r) == "" {
		t.Fatalf("mTLS client: %v %v", r, err)
	}
	// ...one without is not, nor is plaintext.
	anon, _ := grpc.NewClient(in.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: f.CAPool})))
	defer anon.Close()
	if _, err := requestBody(t, anon, bodyOf("gpt-4o-mini", 100)); err == nil {
		t.Fatal("ext_proc served a client without a certificate")
	}
	plain, _ := grpc.NewClient(in.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer plain.Close()
	if _, err := requestBody(t, plain, bodyOf("gpt-4o-mini", 100)); err == nil {
		t.Fatal("ext_proc served plaintext")
	}
}

// R-L4: a token from a secret file with a trailing newline still matches.
func TestTokenIsTrimmed(t *testing.T) {
	t.Setenv("FUSEBOX_ADMIN_TOKEN", "0123456789abcdef0123\n")
	in := startConfig(t, "", &syncBuffer{})
	if code, body := get(t, "http://"+in.AdminAddr()+"/admin/v1/fleets", "0123456789abcdef0123"); code != 200 {
		t.Fatalf("trimmed token refused: %d %s", code, body)
	}
}

// roundTrip500 runs one request to gpt-4o-mini whose upstream answers 500,
// and returns the route it went to.
func roundTrip500(t *testing.T, conn *grpc.ClientConn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdrs := &corev3.HeaderMap{}
	for _, kv := range [][2]string{{":method", "POST"}, {"x-fusebox-model", "gpt-4o-mini"}} {
		hdrs.Headers = append(hdrs.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	_ = s.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs, EndOfStream: true}},
	})
	r, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	route := ""
	for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.Header.Key == "x-fusebox-route" {
			route = string(h.Header.RawValue)
		}
	}
	resp := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("500")}}}
	_ = s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: resp, EndOfStream: true}}})
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = s.CloseSend()
	_, _ = s.Recv()
	return route
}

func send(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// R-API2: a PATCH takes effect on the very next decision, and survives a
// restart.
func TestPatchTakesEffectAtOnceAndSurvivesRestart(t *testing.T) {
	persist := filepath.Join(t.TempDir(), "overlays.json")
	edit := func(doc string) string {
		return strings.Replace(doc, "backend: memory\n", fmt.Sprintf("backend: memory\n  memory: {persist_path: %q}\n", persist), 1)
	}
	in := startEdited(t, edit, &syncBuffer{})
	base := "http://" + in.AdminAddr() + "/admin/v1/gateways/default"
	if code, body := send(t, "PATCH", base, `{"circuit_breaker": {"enabled": true, "failure_threshold": 1}}`); code != 200 || !strings.Contains(body, `"source":"admin"`) {
		t.Fatalf("patch: %d %s", code, body)
	}
	conn, err := grpc.NewClient(in.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	first := roundTrip500(t, conn)
	code, body := get(t, base+"/circuit-breaker", "")
	if code != 200 || !strings.Contains(body, `"`+first+`":{"state":"open"`) {
		t.Fatalf("one failure after the PATCH did not open %s: %s", first, body)
	}
	if next := roundTrip500(t, conn); next == first {
		t.Fatal("the next request still went to the open route")
	}
	// A restart on the same file and persist_path keeps the change.
	in2 := startEdited(t, edit, &syncBuffer{})
	if code, body := get(t, "http://"+in2.AdminAddr()+"/admin/v1/gateways/default", ""); code != 200 || !strings.Contains(body, `"failure_threshold":1`) || !strings.Contains(body, `"source":"admin"`) {
		t.Fatalf("after restart: %d %s", code, body)
	}
}

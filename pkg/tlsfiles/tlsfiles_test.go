package tlsfiles

import (
	"crypto/tls"
	"os"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/tlsfiles/tlstest"
)

// serve accepts TLS connections and completes their handshakes.
func serve(t *testing.T, cfg *tls.Config) string {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func dial(addr string, f tlstest.Files, withClientCert bool) (*tls.ConnectionState, error) {
	cfg := &tls.Config{RootCAs: f.CAPool, ServerName: "127.0.0.1"}
	if withClientCert {
		c, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// TLS 1.3 reports a refused client certificate on the first read.
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil && !isEOF(err) {
		return nil, err
	}
	st := c.ConnectionState()
	return &st, nil
}

func isEOF(err error) bool { return err.Error() == "EOF" }

func TestMutualTLSAndRotation(t *testing.T) {
	dir := t.TempDir()
	f := tlstest.New(t, dir, 1)
	src := &Source{CertFile: f.ServerCert, KeyFile: f.ServerKey, ClientCAFile: f.CA, Interval: time.Nanosecond}
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	mtls := serve(t, src.ServerConfig(true))
	plain := serve(t, src.ServerConfig(false))
	if _, err := dial(mtls, f, false); err == nil {
		t.Fatal("mutual TLS accepted a client without a certificate")
	}
	st, err := dial(mtls, f, true)
	if err != nil {
		t.Fatalf("mutual TLS refused a good client: %v", err)
	}
	if st.PeerCertificates[0].SerialNumber.Int64() != 101 {
		t.Fatalf("serial %v", st.PeerCertificates[0].SerialNumber)
	}
	if _, err := dial(plain, f, false); err != nil {
		t.Fatalf("server-only TLS: %v", err)
	}
	// Rotate: a new server certificate from the same CA, picked up by the
	// next handshake without a restart.
	rot := t.TempDir()
	g := tlstest.New(t, rot, 2)
	for _, p := range [][2]string{{g.ServerCert, f.ServerCert}, {g.ServerKey, f.ServerKey}, {g.CA, f.CA}, {g.ClientCert, f.ClientCert}, {g.ClientKey, f.ClientKey}} {
		b, _ := os.ReadFile(p[0])
		if err := os.WriteFile(p[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(time.Minute)
		_ = os.Chtimes(p[1], later, later)
	}
	st, err = dial(mtls, tlstest.Files{CA: f.CA, CAPool: g.CAPool, ClientCert: f.ClientCert, ClientKey: f.ClientKey}, true)
	if err != nil {
		t.Fatalf("after rotation: %v", err)
	}
	if st.PeerCertificates[0].SerialNumber.Int64() != 102 {
		t.Fatalf("the rotated certificate was not picked up: serial %v", st.PeerCertificates[0].SerialNumber)
	}
	// A broken rotation keeps the last good certificate.
	if err := os.WriteFile(f.ServerKey, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Chtimes(f.ServerKey, time.Now().Add(2*time.Minute), time.Now().Add(2*time.Minute))
	if st, err = dial(mtls, tlstest.Files{CAPool: g.CAPool, ClientCert: f.ClientCert, ClientKey: f.ClientKey}, true); err != nil || st.PeerCertificates[0].SerialNumber.Int64() != 102 {
		t.Fatalf("a broken key file replaced the good certificate: %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	if err := (&Source{CertFile: "/nonexistent", KeyFile: "/nonexistent"}).Load(); err == nil {
		t.Fatal("missing files accepted")
	}
	dir := t.TempDir()
	f := tlstest.New(t, dir, 1)
	if err := (&Source{CertFile: f.ServerCert, KeyFile: f.ServerKey, ClientCAFile: f.ServerKey}).Load(); err == nil {
		t.Fatal("a key file accepted as a CA bundle")
	}
}

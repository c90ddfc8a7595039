package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Source loads a certificate, its key and optionally a client CA bundle, and
// reloads them when a file's size or modification time changes (checked at
// most once per interval, on a handshake).
type Source struct {
	CertFile, KeyFile, ClientCAFile string
	// Interval between checks of the files; 0 = one second.
	Interval time.Duration
	// OnReload, when set, is told of each reload and its error.
	OnReload func(error)

	mu      sync.Mutex
	checked time.Time
	stamp   string
	cert    *tls.Certificate
	pool    *x509.CertPool
}

// Load reads the files now; it is the start-up check.
func (s *Source) Load() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reload(true)
}

func (s *Source) files() []string {
	f := []string{s.CertFile, s.KeyFile}
	if s.ClientCAFile != "" {
		f = append(f, s.ClientCAFile)
	}
	return f
}

func (s *Source) stampNow() string {
	var b []byte
	for _, f := range s.files() {
		st, err := os.Stat(f)
		if err != nil {
			b = append(b, "missing;"...)
			continue
		}
		b = fmt.Appendf(b, "%d/%d;", st.Size(), st.ModTime().UnixNano())
	}
	return string(b)
}

// reload reads the files when they changed (or when force is set). On an
// error the last good material stays in use.
func (s *Source) reload(force bool) error {
	stamp := s.stampNow()
	if !force && stamp == s.stamp {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
	if err != nil {
		return fmt.Errorf("listen.tls: %w", err)
	}
	var pool *x509.CertPool
	if s.ClientCAFile != "" {
		pem, err := os.ReadFile(s.ClientCAFile)
		if err != nil {
			return fmt.Errorf("listen.tls.client_ca_file: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return errors.New("listen.tls.client_ca_file: no PEM certificate in " + s.ClientCAFile)
		}
	}
	s.cert, s.pool, s.stamp = &cert, pool, stamp
	return nil
}

// current returns the material in force, re-reading changed files first.
func (s *Source) current() (*tls.Certificate, *x509.CertPool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	iv := s.Interval
	if iv == 0 {
		iv = time.Second
	}
	if now := time.Now(); now.Sub(s.checked) >= iv {
		s.checked = now
		before := s.stamp
		err := s.reload(false)
		if s.OnReload != nil && (err != nil || s.stamp != before) {
			s.OnReload(err)
		}
	}
	return s.cert, s.pool
}

// ServerConfig returns a TLS configuration for a listener. With mutual set
// and a client CA configured, clients must present a certificate the CA
// signed.
func (s *Source) ServerConfig(mutual bool, nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := s.current()
			c := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: nextProtos, Certificates: []tls.Certificate{*cert}}
			if mutual && pool != nil {
				c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, pool
			}
			return c, nil
		},
	}
}

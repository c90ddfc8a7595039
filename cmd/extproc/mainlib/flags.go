package mainlib

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"
)

// Flags are the command-line settings of SPEC §10; they override the file.
type Flags struct {
	Config    string
	GRPCAddr  string
	AdminAddr string
	RedisURL  string
	// RedisFlag: -redis-url was given (not only FUSEBOX_REDIS_URL): it
	// selects the Redis store.
	RedisFlag   bool
	LogFormat   string
	LogLevel    string
	GracePeriod time.Duration
	// ReloadInterval is how often the config file is polled for changes.
	ReloadInterval time.Duration
	// GRPCServer is the ext_proc listener's gRPC server: "fusebox"
	// (pkg/grpcwire, the default) or "grpc-go".
	GRPCServer string
}

func parseFlags(args []string, stderr io.Writer) (*Flags, error) {
	fs := flag.NewFlagSet("extproc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &Flags{}
	fs.StringVar(&f.Config, "config", "", "config file (default: the embedded default config)")
	fs.StringVar(&f.GRPCAddr, "grpc-addr", "", "ext_proc gRPC listen address (overrides listen.grpc)")
	fs.StringVar(&f.AdminAddr, "admin-addr", "", "admin HTTP listen address (overrides listen.admin)")
	fs.StringVar(&f.RedisURL, "redis-url", "", "Redis URL (overrides store.redis.url and FUSEBOX_REDIS_URL)")
	fs.StringVar(&f.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&f.GracePeriod, "grace-period", 15*time.Second, "on SIGTERM, keep serving this long while reporting not serving")
	fs.DurationVar(&f.ReloadInterval, "reload-interval", time.Second, "how often the config file is checked for changes")
	fs.StringVar(&f.GRPCServer, "grpc-server", "fusebox", "the ext_proc listener's gRPC server: fusebox (its own transport) or grpc-go (grpc-go's server, the one before 0.4)")
	fs.Usage = func() {
		usage(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if f.LogFormat != "text" && f.LogFormat != "json" {
		return nil, fmt.Errorf("-log-format: must be text or json, got %q", f.LogFormat)
	}
	if f.GRPCServer != "fusebox" && f.GRPCServer != "grpc-go" {
		return nil, fmt.Errorf("-grpc-server: must be fusebox or grpc-go, got %q", f.GRPCServer)
	}
	if _, err := parseLevel(f.LogLevel); err != nil {
		return nil, err
	}
	if f.GracePeriod < 0 {
		return nil, fmt.Errorf("-grace-period: must not be negative")
	}
	f.RedisFlag = f.RedisURL != ""
	if f.RedisURL == "" {
		f.RedisURL = os.Getenv("FUSEBOX_REDIS_URL")
	}
	return f, nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("-log-level: must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}

func newLogger(f *Flags, w io.Writer) *slog.Logger {
	lvl, _ := parseLevel(f.LogLevel)
	opts := &slog.HandlerOptions{Level: lvl}
	if f.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

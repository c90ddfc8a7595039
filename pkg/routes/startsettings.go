package routes

import (
	"fmt"
	"reflect"
)

// StartSettings are the parts of a config that take effect only when the
// process starts: listeners, the admin token's variable and the store
// (R-P10). A reload keeps the values in force and warns when the file
// changed one.
type StartSettings struct {
	Listen  Listen
	Limits  Limits
	Admin   AdminConfig
	Store   StoreConfig
	Envoy   EnvoySpec
	Tracing TracingConfig
}

// StartSettingsOf returns rt's start-only settings.
func StartSettingsOf(rt *Runtime) StartSettings {
	return StartSettings{Listen: rt.Listen, Limits: rt.Limits, Admin: rt.Admin, Store: rt.Store, Envoy: rt.Envoy, Tracing: rt.Tracing}
}

// Changed names every start-only field that differs between s and o, in
// the YAML spelling (e.g. "listen.grpc").
func (s StartSettings) Changed(o StartSettings) []string {
	var out []string
	diff := func(prefix string, a, b any) {
		va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
		var walk func(prefix string, a, b reflect.Value)
		walk = func(prefix string, a, b reflect.Value) {
			if a.Kind() != reflect.Struct {
				if !reflect.DeepEqual(a.Interface(), b.Interface()) {
					out = append(out, prefix)
				}
				return
			}
			for i := 0; i < a.NumField(); i++ {
				f := a.Type().Field(i)
				name := f.Tag.Get("yaml")
				if name == "" || name == "-" {
					name = snake(f.Name)
				}
				walk(fmt.Sprintf("%s.%s", prefix, name), a.Field(i), b.Field(i))
			}
		}
		walk(prefix, va, vb)
	}
	diff("listen", s.Listen, o.Listen)
	diff("limits", s.Limits, o.Limits)
	diff("admin", s.Admin, o.Admin)
	diff("store", s.Store, o.Store)
	diff("envoy", s.Envoy, o.Envoy)
	diff("tracing", s.Tracing, o.Tracing)
	return out
}

// snake spells a Go field name as its YAML key (MaxMessageBytes →
// max_message_bytes).
func snake(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			if i > 0 {
				b = append(b, '_')
			}
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return string(b)
}

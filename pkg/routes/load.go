package routes

import (
	_ "embed"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultConfig returns the embedded default document.
func DefaultConfig() []byte { return append([]byte(nil), defaultYAML...) }

// ReadFile returns a config file's document; path "" means the embedded
// default. The read is bounded (R-L10) by MaxMaxConfigBytes, since the
// file's own limits.max_config_bytes is known only once it is parsed:
// Parse then holds the document to that limit.
func ReadFile(path string) ([]byte, error) {
	if path == "" {
		return DefaultConfig(), nil
	}
	return readBounded(path, MaxMaxConfigBytes, ConfigReadTimeout)
}

// LoadFile reads and compiles a config file; path "" means the embedded
// default.
func LoadFile(path string) (*Runtime, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, Options{})
}

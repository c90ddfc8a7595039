package routes

import (
	_ "embed"
	"fmt"
	"os"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultConfig returns the embedded default document.
func DefaultConfig() []byte { return append([]byte(nil), defaultYAML...) }

// ReadFile returns a config file's document; path "" means the embedded
// default.
func ReadFile(path string) ([]byte, error) {
	if path == "" {
		return DefaultConfig(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return data, nil
}

// LoadFile reads and compiles a config file; path "" means the embedded
// default.
func LoadFile(path string) (*Runtime, error) {
	if path == "" {
		return Parse(defaultYAML, Options{})
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return Parse(data, Options{})
}

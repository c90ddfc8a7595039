package fakeprovider

// StartOn starts a provider on a given address ("0.0.0.0:9001").
func StartOn(name, addr string) (*Provider, error) {
	p := &Provider{Name: name}
	if err := p.listen(addr); err != nil {
		return nil, err
	}
	return p, nil
}

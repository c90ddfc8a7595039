package routes

// baseYAML is a valid config the table tests mutate.
const baseYAML = `
policies:
  conservative: {enabled: true, failure_threshold: 10, window_sec: 120, cooldown_ms: 60000}
fleets:
  - name: myra
    circuit_breaker: {enabled: true, failure_threshold: 3, window_sec: 30, cooldown_ms: 15000, failure_status_codes: [500, 502, 503, 504, 429]}
gateways:
  - id: default
    circuit_breaker: {enabled: true, policy: conservative}
    models:
      - name: gpt-4o-mini
        order: listed
        routes: [openai:us-east:gpt-4o-mini, azure:eu-west:gpt-4o-mini]
    routes:
      - key: openai:us-east:gpt-4o-mini
        cluster: openai_us_east
        cost_per_mtok: 0.15
        residency: [us]
      - key: azure:eu-west:gpt-4o-mini
        cluster: azure_eu_west
        cost_per_mtok: 0.15
        residency: [eu]
        fleet: myra
`

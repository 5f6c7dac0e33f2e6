"""HTTP API: one blueprint per resource. `jobq.app` wires them."""

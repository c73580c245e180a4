"""gst-latent benchmarks against diffusers (driven by tools/bench)."""

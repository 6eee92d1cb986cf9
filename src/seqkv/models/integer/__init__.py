"""Integer predictor (placeholder)."""

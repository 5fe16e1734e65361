"""The contract between training and serving: DIN and the recall towers (pure modules), the serving
scorer and its fused unit, the recall space, the vocab, the blend, and the versioned bundle that
carries them. Serving loads these without the training stack."""

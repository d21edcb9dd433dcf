"""Build: assemble a row's context and inputs hash, have the engine write the image, gate it on the smoke checks, then tag it and write its report, SBOM, provenance and lock record."""

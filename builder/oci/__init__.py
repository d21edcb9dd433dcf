"""OCI image layouts and the layers the builder writes into them (issue 31: one write per byte)."""

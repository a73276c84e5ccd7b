"""Local routing consistency metrics (SRP, SCH) of routing traces."""

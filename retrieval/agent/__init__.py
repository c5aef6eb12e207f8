"""What coding agents call beside search: definitions, references, outlines, grep."""

"""``rollbackctl``: the command line (commands, table output, policy files, CRD generation)."""

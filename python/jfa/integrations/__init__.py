"""Framework integrations of jfa (each imports its framework on its own import)."""

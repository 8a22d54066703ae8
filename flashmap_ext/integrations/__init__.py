"""Integrations of FlashMap drafters into serving engines (optional extras; nothing here is imported by
`flashmap_ext` itself)."""

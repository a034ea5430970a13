"""Multimodal-ready Energon components (the seed's ``...energon.multimodal`` namespace)."""

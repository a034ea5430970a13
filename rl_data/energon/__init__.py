"""Megatron-Energon integration: dataset format, writer, configs, task encoders, loader."""

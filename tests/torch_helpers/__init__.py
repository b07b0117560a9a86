"""Spawn-safe sources and scripts for the torch tests (torch-free, so
fastq's workers never import torch for them)."""

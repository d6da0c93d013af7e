"""Slurm (sbatch) and Kubernetes launchers and templates.
"""

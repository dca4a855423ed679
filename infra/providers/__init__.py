"""infra/providers"""

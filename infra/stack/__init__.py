"""infra/stack"""

"""scopes"""

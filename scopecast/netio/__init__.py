"""netio"""

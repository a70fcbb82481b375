"""kestreld.client"""

"""kestreld.protocol"""

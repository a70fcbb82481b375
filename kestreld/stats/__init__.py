"""kestreld.stats"""

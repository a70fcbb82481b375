"""kestreld.pipeline"""

"""kestreld.queues"""

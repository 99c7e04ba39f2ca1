"""Rendering: traces as text (English and Chinese), heatmaps, fonts, and the offline viewer
(its HTML, CSS and JavaScript are package data files in ``assets/``).
"""

"""Ranking a query: the fusion of votes, its parts and signals, grouping into results,
and the result types."""

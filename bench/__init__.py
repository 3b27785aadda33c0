"""kubetrain's benchmarks: ``python -m bench`` runs them and prints one line per figure.

Every figure is a ratio (or a share) against a baseline measured in the same run, side by side, because
the machines that run this are small and noisy: absolute timings from one run say little about the next,
while two things measured minutes apart on the same machine compare fairly. Each figure carries its goal
and the reason for it; see ``docs/benchmarks.md``.
"""

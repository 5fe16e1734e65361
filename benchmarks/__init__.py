"""Side-by-side benchmarks against peers, run by `dinrec bench …`; each prints JSON."""

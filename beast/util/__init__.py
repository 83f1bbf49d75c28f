"""Small mechanisms every layer uses: threads, parent death, stop signals, graph capture,
profiling, records kept between runs, and Python objects named as strings."""

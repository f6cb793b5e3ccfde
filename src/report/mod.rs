//! Human tables, JSON, SVG/PNG charts (plotters) and Chrome-trace timelines.

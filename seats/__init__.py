"""frt.seats — binds resolved, architecture-verified kernels into models. Not built yet (issue: Seats)."""

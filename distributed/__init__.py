"""Everything that knows about more than one process: who we are, how we start, how we talk."""

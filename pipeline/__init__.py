"""opforge stage."""

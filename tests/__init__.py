"""decodetop's tests, one folder per package of src/decodetop (commands/ for the CLI), helpers/ for what they share."""

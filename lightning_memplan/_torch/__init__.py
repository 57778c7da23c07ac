"""Every private torch symbol the package uses, behind one small surface (see :mod:`.compat`)."""

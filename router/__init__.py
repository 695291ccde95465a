"""router: thin gRPC server (see DESIGN.md); lands with the serving issue."""

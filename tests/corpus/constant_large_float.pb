*©_cX©_cX©_cX©_cX:
